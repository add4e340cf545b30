//! `softrdma devinfo`: the devices and their attributes, laid out as
//! `ibv_devinfo` prints them so RDMA engineers read it at a glance.

use std::fmt::Write as _;
use std::process::ExitCode;

use softrdma_verbs::{device_attr, devices, DeviceInfo, GidTable, Mtu};

#[derive(clap::Args)]
pub struct Args {
    /// Only this device.
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// Print all attributes and the GID table.
    #[arg(short, long)]
    verbose: bool,
    /// Only list device names (like ibv_devices).
    #[arg(short, long)]
    list: bool,
}

fn guid(g: u64) -> String {
    let b = g.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn mtu(m: Mtu) -> String {
    format!("{} ({})", m.bytes(), m.to_ibv())
}

/// The text for one device.
pub fn render(d: &DeviceInfo, verbose: bool) -> String {
    let a = device_attr(d);
    let mut o = String::new();
    let _ = writeln!(o, "hca_id:\t{}", d.name);
    let _ = writeln!(o, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(o, "\tfw_ver:\t\t\t\t{}", a.fw_ver);
    let _ = writeln!(o, "\tnode_guid:\t\t\t{}", guid(a.node_guid));
    let _ = writeln!(o, "\tsys_image_guid:\t\t\t{}", guid(a.sys_image_guid));
    let _ = writeln!(o, "\tvendor_id:\t\t\t0x{:04x}", a.vendor_id);
    let _ = writeln!(o, "\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    let _ = writeln!(o, "\thw_ver:\t\t\t\t0x{:x}", a.hw_ver);
    let _ = writeln!(o, "\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    if verbose {
        let _ = writeln!(o, "\tmax_mr_size:\t\t\t0x{:x}", a.max_mr_size);
        let _ = writeln!(o, "\tmax_qp:\t\t\t\t{}", a.max_qp);
        let _ = writeln!(o, "\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
        let _ = writeln!(o, "\tmax_sge:\t\t\t{}", a.max_sge);
        let _ = writeln!(o, "\tmax_cq:\t\t\t\t{}", a.max_cq);
        let _ = writeln!(o, "\tmax_cqe:\t\t\t{}", a.max_cqe);
        let _ = writeln!(o, "\tmax_mr:\t\t\t\t{}", a.max_mr);
        let _ = writeln!(o, "\tmax_pd:\t\t\t\t{}", a.max_pd);
        let _ = writeln!(o, "\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
        let _ = writeln!(o, "\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
        let _ = writeln!(o, "\tatomic_cap:\t\t\tATOMIC_HCA (1)");
        let _ = writeln!(o, "\tmax_mcast_grp:\t\t\t{}", a.max_mcast_grp);
        let _ = writeln!(o, "\tmax_mcast_qp_attach:\t\t{}", a.max_mcast_qp_attach);
        let _ = writeln!(
            o,
            "\tmax_total_mcast_qp_attach:\t{}",
            a.max_total_mcast_qp_attach
        );
        let _ = writeln!(o, "\tmax_srq:\t\t\t{}", a.max_srq);
        let _ = writeln!(o, "\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
        let _ = writeln!(o, "\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
        let _ = writeln!(o, "\tmax_inline_data:\t\t{}", a.max_inline_data);
    }
    let _ = writeln!(o, "\t\tport:\t1");
    let _ = writeln!(o, "\t\t\tstate:\t\t\tPORT_ACTIVE (4)");
    let _ = writeln!(o, "\t\t\tmax_mtu:\t\t{}", mtu(Mtu::B4096));
    let _ = writeln!(o, "\t\t\tactive_mtu:\t\t{}", mtu(Mtu::B4096));
    let _ = writeln!(o, "\t\t\tsm_lid:\t\t\t0");
    let _ = writeln!(o, "\t\t\tport_lid:\t\t0");
    let _ = writeln!(o, "\t\t\tport_lmc:\t\t0x00");
    let _ = writeln!(o, "\t\t\tlink_layer:\t\tEthernet");
    if verbose {
        let _ = writeln!(o, "\t\t\tmax_msg_sz:\t\t0x{:x}", a.max_msg_sz);
        // The port's GID table, laid out as rxe's over the device's
        // interface; printed as rdma-core's ibv_devinfo prints RoCE v2 GIDs.
        let t = GidTable::for_addr(d.addr);
        let _ = writeln!(o, "\t\t\tgid_tbl_len:\t\t{}", t.len());
        for (i, g) in t.entries() {
            let _ = writeln!(
                o,
                "\t\t\tGID[{i:>3}]:\t\t{}, RoCE v2",
                std::net::Ipv6Addr::from(g)
            );
        }
    }
    o
}

pub fn run(a: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let all = devices()?;
    if a.list {
        outln!("    {:<16}\t    {:<16}\taddress", "device", "node GUID");
        outln!(
            "    {:<16}\t    {:<16}\t-------",
            "------",
            "----------------"
        );
        for d in &all {
            let g = device_attr(d).node_guid;
            outln!("    {:<16}\t    {:016x}\t{}", d.name, g, d.addr);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let chosen: Vec<&DeviceInfo> = match &a.device {
        Some(n) => {
            let d = all.iter().find(|d| &d.name == n).ok_or_else(|| {
                format!(
                    "no device '{n}'; devices: {}",
                    all.iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
            vec![d]
        }
        None => all.iter().collect(),
    };
    for d in chosen {
        out!("{}", render(d, a.verbose));
        outln!();
    }
    Ok(ExitCode::SUCCESS)
}
