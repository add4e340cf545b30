//! perftest's flags `softrdma perf` does not implement: each is accepted
//! by the parser (hidden from `--help`) only to be refused by name, with
//! what it would have done, rather than run a test that silently differs
//! from perftest's or fail with a bare "unexpected argument".
//!
//! One table, [`FLAGS`], says everything about each: the parser's
//! arguments are made from it ([`Unsupported`]'s `clap::Args`), and so is
//! the refusal.

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

/// One perftest flag left out.
struct Flag {
    /// The parser's ID of its argument (apart from the implemented
    /// flags'): `unsupported.` and the long form.
    id: &'static str,
    short: Option<char>,
    long: &'static str,
    /// Takes a value (which is not kept: the flag is refused whatever it
    /// says).
    value: bool,
    /// What it does in perftest.
    what: &'static str,
}

macro_rules! flag {
    ($short:expr, $long:literal, $value:expr, $what:literal $(,)?) => {
        Flag {
            id: concat!("unsupported.", $long),
            short: $short,
            long: $long,
            value: $value,
            what: $what,
        }
    };
}

/// The flags, in the order a refusal names the first one given.
const FLAGS: [Flag; 54] = [
    flag!(
        Some('S'),
        "sl",
        true,
        "a service level (RoCE has none to set)",
    ),
    flag!(Some('T'), "tos", true, "a type of service for rdma_cm QPs"),
    flag!(
        Some('L'),
        "hop_limit",
        true,
        "a hop limit (RawEth only in perftest)",
    ),
    flag!(Some('w'), "limit_bw", true, "the bandwidth verifier limit"),
    flag!(
        Some('y'),
        "limit_msgrate",
        true,
        "the message-rate verifier limit",
    ),
    flag!(
        Some('W'),
        "report-counters",
        true,
        "reporting performance counters",
    ),
    flag!(
        Some('O'),
        "dualport",
        false,
        "dual-port mode (softrdma devices have one port)",
    ),
    flag!(
        Some('z'),
        "com_rdma_cm",
        false,
        "exchanging the parameters over rdma_cm with regular QPs (use -R)",
    ),
    flag!(Some('X'), "vector", true, "choosing a completion vector"),
    flag!(Some('g'), "mcg", false, "multicast"),
    flag!(Some('M'), "MGID", true, "multicast"),
    flag!(None, "recv_post_list", true, "posting receives in lists"),
    flag!(
        None,
        "run_infinitely",
        false,
        "running forever and reporting every -D seconds",
    ),
    flag!(None, "out_json", false, "the JSON report"),
    flag!(None, "out_json_file", true, "the JSON report"),
    flag!(None, "cpu_util", false, "the CPU utilisation column"),
    flag!(None, "dlid", true, "a destination LID (RoCE has no LIDs)"),
    flag!(
        None,
        "dont_xchg_versions",
        false,
        "skipping the version exchange",
    ),
    flag!(
        None,
        "force-link",
        true,
        "forcing the link type (softrdma is Ethernet)",
    ),
    flag!(
        None,
        "ipv6",
        false,
        "choosing an IPv6 GID (the address in use decides)",
    ),
    flag!(None, "source_ip", true, "choosing the source IP of rdma_cm"),
    flag!(None, "mmap", true, "an mmap'd file as the buffer"),
    flag!(None, "mmap-offset", true, "an mmap'd file as the buffer"),
    flag!(None, "mr_per_qp", false, "a memory region per QP"),
    flag!(None, "odp", false, "on-demand paging"),
    flag!(None, "output", true, "the one-number output levels"),
    flag!(None, "perform_warm_up", false, "warm-up iterations"),
    flag!(
        None,
        "pkey_index",
        true,
        "a P_Key index (the table has one entry)",
    ),
    flag!(
        None,
        "report-both",
        false,
        "separate RX and TX rows of a -b run",
    ),
    flag!(None, "report-per-port", false, "per-port rows (one port)"),
    flag!(None, "reversed", false, "reversed traffic (server sends)"),
    flag!(None, "retry_count", true, "the rdma_cm retry count"),
    flag!(None, "tclass", true, "a GRH traffic class"),
    flag!(None, "use_hugepages", false, "huge-page buffers"),
    flag!(
        None,
        "wait_destroy",
        true,
        "waiting before the resources are destroyed",
    ),
    flag!(
        None,
        "disable_pcie_relaxed",
        false,
        "PCIe relaxed ordering (there is no PCIe)",
    ),
    flag!(None, "burst_size", true, "the rate limiter"),
    flag!(None, "typical_pkt_size", true, "the rate limiter"),
    flag!(None, "rate_limit", true, "the rate limiter"),
    flag!(None, "rate_units", true, "the rate limiter"),
    flag!(None, "rate_limit_type", true, "the rate limiter"),
    flag!(None, "inline_recv", true, "inline receives"),
    flag!(None, "use-srq", false, "a shared receive queue"),
    flag!(None, "latency_gap", true, "a delay between latency posts"),
    flag!(None, "log_dci_streams", true, "DC (no DC transport)"),
    flag!(None, "log_active_dci_streams", true, "DC (no DC transport)"),
    flag!(None, "aes_xts", false, "AES-XTS encryption"),
    flag!(None, "encrypt_on_tx", false, "AES-XTS encryption"),
    flag!(None, "sig_before", false, "AES-XTS encryption"),
    flag!(None, "aes_block_size", true, "AES-XTS encryption"),
    flag!(None, "data_enc_keys_number", true, "AES-XTS encryption"),
    flag!(None, "kek_path", true, "AES-XTS encryption"),
    flag!(None, "credentials_path", true, "AES-XTS encryption"),
    flag!(None, "data_enc_key_app_path", true, "AES-XTS encryption"),
];

/// Which of [`FLAGS`] the command line gave: the first, if any.
#[derive(Debug, Clone, Default)]
pub struct Unsupported {
    given: Option<usize>,
}

impl Args for Unsupported {
    fn augment_args(cmd: Command) -> Command {
        FLAGS.iter().fold(cmd, |cmd, f| {
            let mut a = Arg::new(f.id).long(f.long).hide(true);
            if let Some(c) = f.short {
                a = a.short(c);
            }
            cmd.arg(if f.value {
                a.action(ArgAction::Set).allow_hyphen_values(true)
            } else {
                a.action(ArgAction::SetTrue)
            })
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for Unsupported {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let given = FLAGS
            .iter()
            .position(|f| m.value_source(f.id) == Some(ValueSource::CommandLine));
        Ok(Unsupported { given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Unsupported {
    /// The first unsupported flag given, as its users spell it, and what
    /// it does in perftest.
    pub fn given(&self) -> Option<(String, &'static str)> {
        let f = &FLAGS[self.given?];
        let name = match f.short {
            Some(c) => format!("-{c}/--{}", f.long),
            None => format!("--{}", f.long),
        };
        Some((name, f.what))
    }
}
