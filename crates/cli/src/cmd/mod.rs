pub mod decode;
pub mod devinfo;
pub mod perf;
