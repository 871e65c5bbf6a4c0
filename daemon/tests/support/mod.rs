pub mod client;
pub mod cm;
