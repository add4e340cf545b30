//! What the CLI's end-to-end tests share.

/// A loopback address of this test process's own (127.<pid>.<n>): a device
/// on it shares UDP port 4791 with no other test running alongside.
pub fn own_address() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(2);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % 254 + 1;
    let pid = std::process::id() % 65536;
    format!("127.{}.{}.{n}", pid >> 8, pid & 0xff)
}
