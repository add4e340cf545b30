//! Which symbol version each export carries.
//!
//! The real libibverbs tags every symbol with the version node it first
//! appeared in, and binaries record that tag: `ibv_modify_qp@IBVERBS_1.1`.
//! The dynamic loader resolves a versioned reference only against a symbol
//! of that version, so each of the 146 default symbols of rdma-core 44's
//! library (`exports.txt`, from the real library's `objdump -T`) is bound
//! to its node with an assembler `.symver` directive; the build script
//! declares the nodes.
//!
//! A `.symver` must sit in the same object file as the symbol it names, so
//! each module declares the versions of its own exports with [`symver!`]
//! (a module's items share a codegen unit). A listed symbol that is not
//! defined there fails the build; `tests::every_export_is_versioned` checks
//! the union of the modules' lists against `exports.txt`, and
//! `tests/exports.rs` checks the built library itself.

/// Bind each listed symbol of this module to its version node.
#[macro_export]
macro_rules! symver {
    ($($ver:literal: $($name:ident),+ ;)+) => {
        #[cfg(not(test))]
        std::arch::global_asm!(concat!(
            $($(".symver ", stringify!($name), ", ", stringify!($name), "@@", $ver, "\n",)+)+
        ));

        /// (version node, symbol) for this module's exports.
        #[cfg(test)]
        pub(crate) const SYMVERS: &[(&str, &str)] = &[$($(($ver, stringify!($name)),)+)+];
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_export_is_versioned() {
        let mut want: Vec<(String, String)> = include_str!("../exports.txt")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let mut w = l.split_whitespace();
                (w.next().unwrap().to_string(), w.next().unwrap().to_string())
            })
            .collect();
        let mut have: Vec<(String, String)> = [
            crate::device::SYMVERS,
            crate::resources::SYMVERS,
            crate::qp::SYMVERS,
            crate::misc::SYMVERS,
            crate::mw::SYMVERS,
            crate::import::SYMVERS,
        ]
        .concat()
        .iter()
        .map(|(v, n)| (v.to_string(), n.to_string()))
        .collect();
        want.sort();
        have.sort();
        assert_eq!(have, want);
    }
}
