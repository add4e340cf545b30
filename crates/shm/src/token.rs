//! A thread's token: a word that names the calling thread among the live
//! threads of the process, read without a thread-local.

/// This thread's token: its thread pointer (a thread-local's address where
/// that cannot be read), never 0, unique among live threads. A thread that
/// exits may leave its token to a thread created later: whoever keys
/// state by it gives that state up when the thread ends.
///
/// On x86-64 Linux, `%fs:0` holds the address of the thread's own control
/// block (the TLS ABI every libc there follows for every thread, however
/// it was created). Read directly, it costs one load in `libibverbs.so.1`
/// too, where a `thread_local!` is a call to `__tls_get_addr` (the dynamic
/// TLS model of a shared library).
#[inline(always)]
pub fn thread_token() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let tp: usize;
        // SAFETY: reads 8 bytes at %fs:0, the thread control block's
        // self-pointer that the libc sets up before any code of the thread
        // runs; touches nothing else (no stack, no flags).
        unsafe {
            std::arch::asm!(
                "mov {}, qword ptr fs:[0]",
                out(reg) tp,
                options(nostack, readonly, preserves_flags)
            )
        };
        tp
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        thread_local! {
            static TOKEN: u8 = const { 0 };
        }
        TOKEN.with(|t| t as *const u8 as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::thread_token;

    /// Two live threads have two tokens; one thread keeps its own.
    #[test]
    fn live_threads_have_distinct_tokens() {
        let mine = thread_token();
        assert_ne!(mine, 0);
        assert_eq!(mine, thread_token());
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            tx.send(thread_token()).unwrap();
            done_rx.recv().unwrap();
        });
        let theirs = rx.recv().unwrap();
        assert_ne!(theirs, 0);
        assert_ne!(theirs, mine, "two live threads share a token");
        done_tx.send(()).unwrap();
        h.join().unwrap();
    }
}
