//! placeholder
pub struct CmEndpoint;
pub enum CmEvent {}
pub struct ConnId;
pub struct EndpointConfig;
pub struct Transmit;
