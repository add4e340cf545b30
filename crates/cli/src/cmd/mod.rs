pub mod coll;
pub mod decode;
pub mod devinfo;
pub mod perf;
pub mod pingpong;
pub mod sim;
