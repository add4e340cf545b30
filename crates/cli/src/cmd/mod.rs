pub mod coll;
pub mod decode;
pub mod devinfo;
pub mod perf;
pub mod pingpong;
pub mod run;
pub mod sim;

/// `--cc`'s value: a congestion control name with optional parameters
/// (`timely:seg=16K,init=0.1`), checked when the arguments are parsed.
pub fn cc_spec(s: &str) -> Result<String, String> {
    softrdma_core::cc::CcConfig::parse(s).map(|_| s.to_string())
}
