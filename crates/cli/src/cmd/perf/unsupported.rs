//! perftest's flags `softrdma perf` does not implement: each is accepted
//! by the parser (hidden from `--help`) only to be refused by name, with
//! what it would have done, rather than run a test that silently differs
//! from perftest's or fail with a bare "unexpected argument".

/// That a valued flag was given (its value is not kept: the flag is
/// refused whatever it says, and a `String` a field made `Args` a large
/// enum variant).
#[derive(Debug, Clone, Copy)]
pub struct Given;

impl std::str::FromStr for Given {
    type Err = std::convert::Infallible;
    fn from_str(_: &str) -> Result<Given, Self::Err> {
        Ok(Given)
    }
}

/// The perftest flags left out, one field each.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Unsupported {
    #[arg(short = 'f', long = "margin", hide = true, allow_hyphen_values = true)]
    margin: Option<Given>,
    #[arg(short = 'S', long = "sl", hide = true, allow_hyphen_values = true)]
    sl: Option<Given>,
    #[arg(short = 'T', long = "tos", hide = true, allow_hyphen_values = true)]
    tos: Option<Given>,
    #[arg(
        short = 'L',
        long = "hop_limit",
        hide = true,
        allow_hyphen_values = true
    )]
    hop_limit: Option<Given>,
    #[arg(
        short = 'w',
        long = "limit_bw",
        hide = true,
        allow_hyphen_values = true
    )]
    limit_bw: Option<Given>,
    #[arg(
        short = 'y',
        long = "limit_msgrate",
        hide = true,
        allow_hyphen_values = true
    )]
    limit_msgrate: Option<Given>,
    #[arg(
        short = 'W',
        long = "report-counters",
        hide = true,
        allow_hyphen_values = true
    )]
    report_counters: Option<Given>,
    #[arg(short = 'O', long = "dualport", hide = true)]
    dualport: bool,
    #[arg(short = 'z', long = "com_rdma_cm", hide = true)]
    com_rdma_cm: bool,
    #[arg(short = 'X', long = "vector", hide = true, allow_hyphen_values = true)]
    vector: Option<Given>,
    #[arg(short = 'g', long = "mcg", hide = true)]
    mcg: bool,
    #[arg(short = 'M', long = "MGID", hide = true, allow_hyphen_values = true)]
    mgid: Option<Given>,
    #[arg(short = 'C', long = "report-cycles", hide = true)]
    report_cycles: bool,
    #[arg(short = 'H', long = "report-histogram", hide = true)]
    report_histogram: bool,
    #[arg(short = 'U', long = "report-unsorted", hide = true)]
    report_unsorted: bool,
    #[arg(long = "recv_post_list", hide = true, allow_hyphen_values = true)]
    recv_post_list: Option<Given>,
    #[arg(long = "run_infinitely", hide = true)]
    run_infinitely: bool,
    #[arg(long = "out_json", hide = true)]
    out_json: bool,
    #[arg(long = "out_json_file", hide = true, allow_hyphen_values = true)]
    out_json_file: Option<Given>,
    #[arg(long = "cpu_util", hide = true)]
    cpu_util: bool,
    #[arg(long = "dlid", hide = true, allow_hyphen_values = true)]
    dlid: Option<Given>,
    #[arg(long = "dont_xchg_versions", hide = true)]
    dont_xchg_versions: bool,
    #[arg(long = "force-link", hide = true, allow_hyphen_values = true)]
    force_link: Option<Given>,
    #[arg(long = "ipv6", hide = true)]
    ipv6: bool,
    #[arg(long = "source_ip", hide = true, allow_hyphen_values = true)]
    source_ip: Option<Given>,
    #[arg(long = "mmap", hide = true, allow_hyphen_values = true)]
    mmap: Option<Given>,
    #[arg(long = "mmap-offset", hide = true, allow_hyphen_values = true)]
    mmap_offset: Option<Given>,
    #[arg(long = "mr_per_qp", hide = true)]
    mr_per_qp: bool,
    #[arg(long = "odp", hide = true)]
    odp: bool,
    #[arg(long = "output", hide = true, allow_hyphen_values = true)]
    output: Option<Given>,
    #[arg(long = "perform_warm_up", hide = true)]
    perform_warm_up: bool,
    #[arg(long = "pkey_index", hide = true, allow_hyphen_values = true)]
    pkey_index: Option<Given>,
    #[arg(long = "report-both", hide = true)]
    report_both: bool,
    #[arg(long = "report-per-port", hide = true)]
    report_per_port: bool,
    #[arg(long = "reversed", hide = true)]
    reversed: bool,
    #[arg(long = "retry_count", hide = true, allow_hyphen_values = true)]
    retry_count: Option<Given>,
    #[arg(long = "tclass", hide = true, allow_hyphen_values = true)]
    tclass: Option<Given>,
    #[arg(long = "use_hugepages", hide = true)]
    use_hugepages: bool,
    #[arg(long = "wait_destroy", hide = true, allow_hyphen_values = true)]
    wait_destroy: Option<Given>,
    #[arg(long = "disable_pcie_relaxed", hide = true)]
    disable_pcie_relaxed: bool,
    #[arg(long = "burst_size", hide = true, allow_hyphen_values = true)]
    burst_size: Option<Given>,
    #[arg(long = "typical_pkt_size", hide = true, allow_hyphen_values = true)]
    typical_pkt_size: Option<Given>,
    #[arg(long = "rate_limit", hide = true, allow_hyphen_values = true)]
    rate_limit: Option<Given>,
    #[arg(long = "rate_units", hide = true, allow_hyphen_values = true)]
    rate_units: Option<Given>,
    #[arg(long = "rate_limit_type", hide = true, allow_hyphen_values = true)]
    rate_limit_type: Option<Given>,
    #[arg(long = "inline_recv", hide = true, allow_hyphen_values = true)]
    inline_recv: Option<Given>,
    #[arg(long = "use-srq", hide = true)]
    use_srq: bool,
    #[arg(long = "latency_gap", hide = true, allow_hyphen_values = true)]
    latency_gap: Option<Given>,
    #[arg(long = "log_dci_streams", hide = true, allow_hyphen_values = true)]
    log_dci_streams: Option<Given>,
    #[arg(
        long = "log_active_dci_streams",
        hide = true,
        allow_hyphen_values = true
    )]
    log_active_dci_streams: Option<Given>,
    #[arg(long = "aes_xts", hide = true)]
    aes_xts: bool,
    #[arg(long = "encrypt_on_tx", hide = true)]
    encrypt_on_tx: bool,
    #[arg(long = "sig_before", hide = true)]
    sig_before: bool,
    #[arg(long = "aes_block_size", hide = true, allow_hyphen_values = true)]
    aes_block_size: Option<Given>,
    #[arg(long = "data_enc_keys_number", hide = true, allow_hyphen_values = true)]
    data_enc_keys_number: Option<Given>,
    #[arg(long = "kek_path", hide = true, allow_hyphen_values = true)]
    kek_path: Option<Given>,
    #[arg(long = "credentials_path", hide = true, allow_hyphen_values = true)]
    credentials_path: Option<Given>,
    #[arg(
        long = "data_enc_key_app_path",
        hide = true,
        allow_hyphen_values = true
    )]
    data_enc_key_app_path: Option<Given>,
}

impl Unsupported {
    /// The first unsupported flag given, as its users spell it, and what
    /// it does in perftest.
    pub fn given(&self) -> Option<(String, &'static str)> {
        let all: [(bool, Option<char>, &str, &'static str); 58] = [
            (
                self.margin.is_some(),
                Some('f'),
                "margin",
                "measuring within margins of a -D run (the margins are a quarter of -D)",
            ),
            (
                self.sl.is_some(),
                Some('S'),
                "sl",
                "a service level (RoCE has none to set)",
            ),
            (
                self.tos.is_some(),
                Some('T'),
                "tos",
                "a type of service for rdma_cm QPs",
            ),
            (
                self.hop_limit.is_some(),
                Some('L'),
                "hop_limit",
                "a hop limit (RawEth only in perftest)",
            ),
            (
                self.limit_bw.is_some(),
                Some('w'),
                "limit_bw",
                "the bandwidth verifier limit",
            ),
            (
                self.limit_msgrate.is_some(),
                Some('y'),
                "limit_msgrate",
                "the message-rate verifier limit",
            ),
            (
                self.report_counters.is_some(),
                Some('W'),
                "report-counters",
                "reporting performance counters",
            ),
            (
                self.dualport,
                Some('O'),
                "dualport",
                "dual-port mode (softrdma devices have one port)",
            ),
            (
                self.com_rdma_cm,
                Some('z'),
                "com_rdma_cm",
                "exchanging the parameters over rdma_cm with regular QPs (use -R)",
            ),
            (
                self.vector.is_some(),
                Some('X'),
                "vector",
                "choosing a completion vector",
            ),
            (self.mcg, Some('g'), "mcg", "multicast"),
            (self.mgid.is_some(), Some('M'), "MGID", "multicast"),
            (
                self.report_cycles,
                Some('C'),
                "report-cycles",
                "reporting latencies in CPU cycles",
            ),
            (
                self.report_histogram,
                Some('H'),
                "report-histogram",
                "printing every latency sample",
            ),
            (
                self.report_unsorted,
                Some('U'),
                "report-unsorted",
                "printing every latency sample unsorted",
            ),
            (
                self.recv_post_list.is_some(),
                None,
                "recv_post_list",
                "posting receives in lists",
            ),
            (
                self.run_infinitely,
                None,
                "run_infinitely",
                "running forever and reporting every -D seconds",
            ),
            (self.out_json, None, "out_json", "the JSON report"),
            (
                self.out_json_file.is_some(),
                None,
                "out_json_file",
                "the JSON report",
            ),
            (
                self.cpu_util,
                None,
                "cpu_util",
                "the CPU utilisation column",
            ),
            (
                self.dlid.is_some(),
                None,
                "dlid",
                "a destination LID (RoCE has no LIDs)",
            ),
            (
                self.dont_xchg_versions,
                None,
                "dont_xchg_versions",
                "skipping the version exchange",
            ),
            (
                self.force_link.is_some(),
                None,
                "force-link",
                "forcing the link type (softrdma is Ethernet)",
            ),
            (
                self.ipv6,
                None,
                "ipv6",
                "choosing an IPv6 GID (the address in use decides)",
            ),
            (
                self.source_ip.is_some(),
                None,
                "source_ip",
                "choosing the source IP of rdma_cm",
            ),
            (
                self.mmap.is_some(),
                None,
                "mmap",
                "an mmap'd file as the buffer",
            ),
            (
                self.mmap_offset.is_some(),
                None,
                "mmap-offset",
                "an mmap'd file as the buffer",
            ),
            (self.mr_per_qp, None, "mr_per_qp", "a memory region per QP"),
            (self.odp, None, "odp", "on-demand paging"),
            (
                self.output.is_some(),
                None,
                "output",
                "the one-number output levels",
            ),
            (
                self.perform_warm_up,
                None,
                "perform_warm_up",
                "warm-up iterations",
            ),
            (
                self.pkey_index.is_some(),
                None,
                "pkey_index",
                "a P_Key index (the table has one entry)",
            ),
            (
                self.report_both,
                None,
                "report-both",
                "separate RX and TX rows of a -b run",
            ),
            (
                self.report_per_port,
                None,
                "report-per-port",
                "per-port rows (one port)",
            ),
            (
                self.reversed,
                None,
                "reversed",
                "reversed traffic (server sends)",
            ),
            (
                self.retry_count.is_some(),
                None,
                "retry_count",
                "the rdma_cm retry count",
            ),
            (self.tclass.is_some(), None, "tclass", "a GRH traffic class"),
            (
                self.use_hugepages,
                None,
                "use_hugepages",
                "huge-page buffers",
            ),
            (
                self.wait_destroy.is_some(),
                None,
                "wait_destroy",
                "waiting before the resources are destroyed",
            ),
            (
                self.disable_pcie_relaxed,
                None,
                "disable_pcie_relaxed",
                "PCIe relaxed ordering (there is no PCIe)",
            ),
            (
                self.burst_size.is_some(),
                None,
                "burst_size",
                "the rate limiter",
            ),
            (
                self.typical_pkt_size.is_some(),
                None,
                "typical_pkt_size",
                "the rate limiter",
            ),
            (
                self.rate_limit.is_some(),
                None,
                "rate_limit",
                "the rate limiter",
            ),
            (
                self.rate_units.is_some(),
                None,
                "rate_units",
                "the rate limiter",
            ),
            (
                self.rate_limit_type.is_some(),
                None,
                "rate_limit_type",
                "the rate limiter",
            ),
            (
                self.inline_recv.is_some(),
                None,
                "inline_recv",
                "inline receives",
            ),
            (self.use_srq, None, "use-srq", "a shared receive queue"),
            (
                self.latency_gap.is_some(),
                None,
                "latency_gap",
                "a delay between latency posts",
            ),
            (
                self.log_dci_streams.is_some(),
                None,
                "log_dci_streams",
                "DC (no DC transport)",
            ),
            (
                self.log_active_dci_streams.is_some(),
                None,
                "log_active_dci_streams",
                "DC (no DC transport)",
            ),
            (self.aes_xts, None, "aes_xts", "AES-XTS encryption"),
            (
                self.encrypt_on_tx,
                None,
                "encrypt_on_tx",
                "AES-XTS encryption",
            ),
            (self.sig_before, None, "sig_before", "AES-XTS encryption"),
            (
                self.aes_block_size.is_some(),
                None,
                "aes_block_size",
                "AES-XTS encryption",
            ),
            (
                self.data_enc_keys_number.is_some(),
                None,
                "data_enc_keys_number",
                "AES-XTS encryption",
            ),
            (
                self.kek_path.is_some(),
                None,
                "kek_path",
                "AES-XTS encryption",
            ),
            (
                self.credentials_path.is_some(),
                None,
                "credentials_path",
                "AES-XTS encryption",
            ),
            (
                self.data_enc_key_app_path.is_some(),
                None,
                "data_enc_key_app_path",
                "AES-XTS encryption",
            ),
        ];
        all.into_iter().find(|a| a.0).map(|(_, short, long, what)| {
            let name = match short {
                Some(c) => format!("-{c}/--{long}"),
                None => format!("--{long}"),
            };
            (name, what)
        })
    }
}
