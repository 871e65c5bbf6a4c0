#[allow(dead_code)]
pub mod capture;
pub mod client;
pub mod cm;
