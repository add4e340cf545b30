//! The QP state machine (IBA vol. 1, 10.3 and 11.2.5), written as a table.
//!
//! [`TRANSITIONS`] lists every transition a QP may make and, per transport
//! service, which [`AttrMask`] bits that `modify_qp` must carry and which it
//! may carry. It mirrors the Linux kernel's `qp_state_table`, used by
//! `ib_modify_qp_is_ok()`, so an application that works on a kernel provider
//! is accepted here and one that is refused there is refused here, with an
//! error that says which bits were missing or extra.
//!
//! This module only decides whether a modify is well-formed. Whether each
//! value is in range is [`QpAttr::validate`](super::attr::QpAttr::validate);
//! carrying the transition out (flushing queues, arming timers) is the QP
//! owner's job. State changes the QP makes by itself (to SQE or ERR on a
//! transport error, SQD finishing its drain) are not modify calls and are
//! not in this table.
//!
//! The whole table is snapshot-tested: `tests/snapshots/qp_transitions.txt`
//! holds one line per (QP type, from, to), so any change to the rules shows
//! up as a reviewable diff. Regenerate it with `UPDATE_SNAPSHOTS=1`.

use std::fmt;

use super::attr::AttrMask;

/// `enum ibv_qp_state`; the discriminants are libibverbs' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    #[default]
    Reset = 0,
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drain(ing/ed).
    Sqd = 4,
    /// Send queue error (UC and UD only).
    Sqe = 5,
    Err = 6,
}

impl QpState {
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// From an `IBV_QPS_*` value; anything else (including
    /// `IBV_QPS_UNKNOWN`) is not a state a QP can be put in.
    pub const fn from_ibv(value: u32) -> Option<QpState> {
        match value {
            0 => Some(QpState::Reset),
            1 => Some(QpState::Init),
            2 => Some(QpState::Rtr),
            3 => Some(QpState::Rts),
            4 => Some(QpState::Sqd),
            5 => Some(QpState::Sqe),
            6 => Some(QpState::Err),
            _ => None,
        }
    }
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }
    /// The name verbs documentation uses: `RESET`, `INIT`, `RTR`, ...
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The transport services softrdma implements (`enum ibv_qp_type` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc = 2,
    /// Unreliable connected.
    Uc = 3,
    /// Unreliable datagram.
    Ud = 4,
    /// XRC initiator (`IBV_QPT_XRC_SEND`): an RC requester whose every
    /// request names the XRC SRQ it is for; no receive queue.
    XrcSend = 9,
    /// XRC target (`IBV_QPT_XRC_RECV`): an RC responder of an XRC domain,
    /// with no send or receive queue, CQ or PD of its own: each request
    /// goes to the XRC SRQ it names, under that SRQ's PD and CQ.
    XrcRecv = 10,
}

impl QpType {
    pub const ALL: [QpType; 5] = [
        QpType::Rc,
        QpType::Uc,
        QpType::Ud,
        QpType::XrcSend,
        QpType::XrcRecv,
    ];

    /// From an `IBV_QPT_*` value; other types (raw packet, driver) are not
    /// implemented and give `None`.
    pub const fn from_ibv(value: u32) -> Option<QpType> {
        match value {
            2 => Some(QpType::Rc),
            3 => Some(QpType::Uc),
            4 => Some(QpType::Ud),
            9 => Some(QpType::XrcSend),
            10 => Some(QpType::XrcRecv),
            _ => None,
        }
    }
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }
    pub const fn name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::XrcSend => "XRC_SEND",
            QpType::XrcRecv => "XRC_RECV",
        }
    }

    /// RC's reliable service (acknowledged, retried, with READ and
    /// atomics): RC and both halves of XRC.
    pub const fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcSend | QpType::XrcRecv)
    }

    /// Either half of XRC.
    pub const fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcSend | QpType::XrcRecv)
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The attribute bits one transition takes for one QP type. `STATE` is
/// implied (it selects the transition) and appears in neither set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrRule {
    /// Bits the mask must contain.
    pub required: AttrMask,
    /// Bits the mask may contain besides the required ones and `STATE`.
    pub optional: AttrMask,
}

impl AttrRule {
    /// Every bit a mask may carry for this transition.
    pub const fn allowed(self) -> AttrMask {
        self.required.union(self.optional).union(AttrMask::STATE)
    }
}

/// One row of [`TRANSITIONS`]: a state pair and, per QP type, its rule, or
/// `None` where that QP type cannot make the transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: QpState,
    pub to: QpState,
    pub rc: Option<AttrRule>,
    pub uc: Option<AttrRule>,
    pub ud: Option<AttrRule>,
    /// XRC initiator (`IBV_QPT_XRC_SEND`).
    pub xi: Option<AttrRule>,
    /// XRC target (`IBV_QPT_XRC_RECV`).
    pub xt: Option<AttrRule>,
}

impl Transition {
    pub const fn rule(&self, qp_type: QpType) -> Option<AttrRule> {
        match qp_type {
            QpType::Rc => self.rc,
            QpType::Uc => self.uc,
            QpType::Ud => self.ud,
            QpType::XrcSend => self.xi,
            QpType::XrcRecv => self.xt,
        }
    }
}

/// `mask!(AV | PATH_MTU)`: an [`AttrMask`] spelled like the kernel's table.
macro_rules! mask {
    ($($bit:ident)|*) => {
        AttrMask::EMPTY $(.union(AttrMask::$bit))*
    };
}

const fn allow(required: AttrMask, optional: AttrMask) -> Option<AttrRule> {
    Some(AttrRule { required, optional })
}

/// The QP type cannot make this transition.
const NEVER: Option<AttrRule> = None;

/// Moving to RESET or ERR: always allowed, from any state, for every QP
/// type, and takes no attributes besides STATE.
const fn teardown(from: QpState, to: QpState) -> Transition {
    let rule = allow(AttrMask::EMPTY, AttrMask::EMPTY);
    Transition {
        from,
        to,
        rc: rule,
        uc: rule,
        ud: rule,
        xi: rule,
        xt: rule,
    }
}

/// Every transition `modify_qp` may request, with the attributes it takes.
///
/// Pairs that are not listed are invalid for every QP type. The rows follow
/// the kernel's `qp_state_table` for RC, UC, UD and the two XRC halves
/// (`xi` initiator, `xt` target: the initiator has no responder to size at
/// RTR, the target no requester to arm at RTS); the one place this
/// table is stricter is SQE->RTS for RC, which the kernel's table lets
/// through with no attributes but which cannot arise, because an RC QP never
/// enters SQE (IBA 10.3.1: send-queue errors on RC go straight to ERR;
/// likewise XRC).
pub static TRANSITIONS: &[Transition] = {
    // Scoped here so that `Err` means the state only inside the table.
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    &[
        // Teardown from every state.
        teardown(Reset, Reset),
        teardown(Init, Reset),
        teardown(Rtr, Reset),
        teardown(Rts, Reset),
        teardown(Sqd, Reset),
        teardown(Sqe, Reset),
        teardown(Err, Reset),
        teardown(Reset, Err),
        teardown(Init, Err),
        teardown(Rtr, Err),
        teardown(Rts, Err),
        teardown(Sqd, Err),
        teardown(Sqe, Err),
        teardown(Err, Err),
        // Bring-up: bind to a port and P_Key, then say who may touch us.
        Transition {
            from: Reset,
            to: Init,
            rc: allow(mask!(PKEY_INDEX | PORT | ACCESS_FLAGS), mask!()),
            uc: allow(mask!(PKEY_INDEX | PORT | ACCESS_FLAGS), mask!()),
            ud: allow(mask!(PKEY_INDEX | PORT | QKEY), mask!()),
            xi: allow(mask!(PKEY_INDEX | PORT | ACCESS_FLAGS), mask!()),
            xt: allow(mask!(PKEY_INDEX | PORT | ACCESS_FLAGS), mask!()),
        },
        Transition {
            from: Init,
            to: Init,
            rc: allow(mask!(), mask!(PKEY_INDEX | PORT | ACCESS_FLAGS)),
            uc: allow(mask!(), mask!(PKEY_INDEX | PORT | ACCESS_FLAGS)),
            ud: allow(mask!(), mask!(PKEY_INDEX | PORT | QKEY)),
            xi: allow(mask!(), mask!(PKEY_INDEX | PORT | ACCESS_FLAGS)),
            xt: allow(mask!(), mask!(PKEY_INDEX | PORT | ACCESS_FLAGS)),
        },
        // Connected types learn their peer here; RC also sizes its responder
        // (read/atomic resources, RNR timer it advertises).
        Transition {
            from: Init,
            to: Rtr,
            rc: allow(
                mask!(AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER),
                mask!(ALT_PATH | ACCESS_FLAGS | PKEY_INDEX),
            ),
            uc: allow(
                mask!(AV | PATH_MTU | DEST_QPN | RQ_PSN),
                mask!(ALT_PATH | ACCESS_FLAGS | PKEY_INDEX),
            ),
            ud: allow(mask!(), mask!(PKEY_INDEX | QKEY)),
            xi: allow(
                mask!(AV | PATH_MTU | DEST_QPN | RQ_PSN),
                mask!(ALT_PATH | ACCESS_FLAGS | PKEY_INDEX),
            ),
            xt: allow(
                mask!(AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER),
                mask!(ALT_PATH | ACCESS_FLAGS | PKEY_INDEX),
            ),
        },
        // The requester side: starting PSN, and for RC the retry machinery.
        Transition {
            from: Rtr,
            to: Rts,
            rc: allow(
                mask!(TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC),
                mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE),
            ),
            uc: allow(
                mask!(SQ_PSN),
                mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE),
            ),
            ud: allow(mask!(SQ_PSN), mask!(CUR_STATE | QKEY)),
            xi: allow(
                mask!(TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC),
                mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE),
            ),
            xt: allow(
                mask!(TIMEOUT | SQ_PSN),
                mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE),
            ),
        },
        Transition {
            from: Rts,
            to: Rts,
            rc: allow(
                mask!(),
                mask!(CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER),
            ),
            uc: allow(
                mask!(),
                mask!(CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE),
            ),
            ud: allow(mask!(), mask!(CUR_STATE | QKEY)),
            xi: allow(
                mask!(),
                mask!(CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE),
            ),
            xt: allow(
                mask!(),
                mask!(CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER),
            ),
        },
        // Drain the send queue so path attributes can change under SQD.
        Transition {
            from: Rts,
            to: Sqd,
            rc: allow(mask!(), mask!(EN_SQD_ASYNC_NOTIFY)),
            uc: allow(mask!(), mask!(EN_SQD_ASYNC_NOTIFY)),
            ud: allow(mask!(), mask!(EN_SQD_ASYNC_NOTIFY)),
            xi: allow(mask!(), mask!(EN_SQD_ASYNC_NOTIFY)),
            xt: allow(mask!(), mask!(EN_SQD_ASYNC_NOTIFY)),
        },
        Transition {
            from: Sqd,
            to: Rts,
            rc: allow(
                mask!(),
                mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE),
            ),
            uc: allow(
                mask!(),
                mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE),
            ),
            ud: allow(mask!(), mask!(CUR_STATE | QKEY)),
            xi: allow(
                mask!(),
                mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE),
            ),
            xt: allow(
                mask!(),
                mask!(CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE),
            ),
        },
        // In SQD (once drained; the owner checks that) almost everything about
        // the path and the requester may change.
        Transition {
            from: Sqd,
            to: Sqd,
            rc: allow(
                mask!(),
                mask!(
                    PORT | AV
                        | TIMEOUT
                        | RETRY_CNT
                        | RNR_RETRY
                        | MAX_QP_RD_ATOMIC
                        | MAX_DEST_RD_ATOMIC
                        | ALT_PATH
                        | ACCESS_FLAGS
                        | PKEY_INDEX
                        | MIN_RNR_TIMER
                        | PATH_MIG_STATE
                ),
            ),
            uc: allow(
                mask!(),
                mask!(AV | ALT_PATH | ACCESS_FLAGS | PKEY_INDEX | PATH_MIG_STATE),
            ),
            ud: allow(mask!(), mask!(PKEY_INDEX | QKEY)),
            xi: allow(
                mask!(),
                mask!(
                    PORT | AV
                        | TIMEOUT
                        | RETRY_CNT
                        | RNR_RETRY
                        | MAX_QP_RD_ATOMIC
                        | ALT_PATH
                        | ACCESS_FLAGS
                        | PKEY_INDEX
                        | PATH_MIG_STATE
                ),
            ),
            xt: allow(
                mask!(),
                mask!(
                    PORT | AV
                        | TIMEOUT
                        | MAX_DEST_RD_ATOMIC
                        | ALT_PATH
                        | ACCESS_FLAGS
                        | PKEY_INDEX
                        | MIN_RNR_TIMER
                        | PATH_MIG_STATE
                ),
            ),
        },
        // Recovery from a send-queue error, which only UC and UD have.
        Transition {
            from: Sqe,
            to: Rts,
            rc: NEVER,
            uc: allow(mask!(), mask!(CUR_STATE | ACCESS_FLAGS)),
            ud: allow(mask!(), mask!(CUR_STATE | QKEY)),
            xi: NEVER,
            xt: NEVER,
        },
    ]
};

/// The rule for `from -> to` on a QP of type `qp_type`, or `None` if that
/// QP type cannot make the transition.
pub fn transition_rule(from: QpState, to: QpState, qp_type: QpType) -> Option<AttrRule> {
    TRANSITIONS
        .iter()
        .find(|t| t.from == from && t.to == to)
        .and_then(|t| t.rule(qp_type))
}

/// The minimal `modify_qp` mask for `from -> to` on a QP of type
/// `qp_type`: `STATE` plus every required attribute, straight from the
/// transition table (so tools and tests never spell it out again).
pub fn required_mask(from: QpState, to: QpState, qp_type: QpType) -> Option<AttrMask> {
    transition_rule(from, to, qp_type).map(|r| r.required | AttrMask::STATE)
}

/// Why a `modify_qp` call is not well-formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModifyError {
    /// The mask has `STATE` but no target state was given.
    MissingTargetState { from: QpState, qp_type: QpType },
    /// No such transition for this QP type.
    InvalidTransition {
        from: QpState,
        to: QpState,
        qp_type: QpType,
    },
    /// Required attribute bits absent from the mask.
    MissingAttributes {
        from: QpState,
        to: QpState,
        qp_type: QpType,
        missing: AttrMask,
    },
    /// Mask bits that this transition does not take.
    UnsupportedAttributes {
        from: QpState,
        to: QpState,
        qp_type: QpType,
        extra: AttrMask,
    },
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::MissingTargetState { from, qp_type } => write!(
                f,
                "modify of {qp_type} QP in {from}: the mask has STATE but no target state was given"
            ),
            Self::InvalidTransition { from, to, qp_type } if from == to => write!(
                f,
                "{from}->{to} is not a valid transition for {qp_type} QP: \
                 a {qp_type} QP in {from} cannot have attributes modified without a state change"
            ),
            Self::InvalidTransition { from, to, qp_type } => {
                write!(f, "{from}->{to} is not a valid transition for {qp_type} QP")
            }
            Self::MissingAttributes {
                from,
                to,
                qp_type,
                missing,
            } => write!(f, "{from}->{to} for {qp_type} QP requires {missing}"),
            Self::UnsupportedAttributes {
                from,
                to,
                qp_type,
                extra,
            } => {
                write!(f, "{from}->{to} for {qp_type} QP does not take {extra}")?;
                if let Some(rule) = transition_rule(from, to, qp_type) {
                    write!(f, " (it takes {})", rule.allowed())?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ModifyError {}

/// Decides whether `modify_qp(mask, new_state)` is well-formed for a QP of
/// type `qp_type` currently in `cur`, and returns the state it leads to.
///
/// As in the kernel, the target is `new_state` when the mask has `STATE`
/// and `cur` otherwise (`new_state` is then ignored, as libibverbs ignores
/// `attr.qp_state`): a modify without `STATE` changes attributes in place
/// and is allowed only where the self-transition `cur -> cur` exists.
///
/// When both required bits are missing and extra bits are present, the
/// missing ones are reported: they are usually the real mistake.
pub fn check_modify(
    cur: QpState,
    qp_type: QpType,
    mask: AttrMask,
    new_state: Option<QpState>,
) -> Result<QpState, ModifyError> {
    let to = if mask.contains(AttrMask::STATE) {
        new_state.ok_or(ModifyError::MissingTargetState { from: cur, qp_type })?
    } else {
        cur
    };
    let rule = transition_rule(cur, to, qp_type).ok_or(ModifyError::InvalidTransition {
        from: cur,
        to,
        qp_type,
    })?;
    let missing = rule.required.difference(mask);
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes {
            from: cur,
            to,
            qp_type,
            missing,
        });
    }
    let extra = mask.difference(rule.allowed());
    if !extra.is_empty() {
        return Err(ModifyError::UnsupportedAttributes {
            from: cur,
            to,
            qp_type,
            extra,
        });
    }
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    // `Err` stays `Err` here; the ERR state is spelled `QpState::Err`.
    use std::path::PathBuf;
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};

    const SNAPSHOT: &str = "tests/snapshots/qp_transitions.txt";

    fn show(mask: AttrMask) -> String {
        if mask.is_empty() {
            "-".to_string()
        } else {
            mask.to_string()
        }
    }

    /// One line per (QP type, from, to), in ibv order.
    fn render_table() -> String {
        let mut out = String::from(
            "# QP state transitions: one line per (QP type, from, to).\n\
             # required/optional list attribute mask bits besides STATE.\n\
             # Generated by qp::state::tests::transition_table_snapshot;\n\
             # regenerate with UPDATE_SNAPSHOTS=1 cargo test -p softrdma-core.\n",
        );
        for qp_type in QpType::ALL {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    let pair = format!("{from}->{to}");
                    let line = match transition_rule(from, to, qp_type) {
                        Some(rule) => format!(
                            "{qp_type} {pair:<12} legal    required={} optional={}",
                            show(rule.required),
                            show(rule.optional)
                        ),
                        None => format!("{qp_type} {pair:<12} illegal"),
                    };
                    out.push_str(line.trim_end());
                    out.push('\n');
                }
            }
        }
        out
    }

    #[test]
    fn transition_table_snapshot() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(SNAPSHOT);
        let actual = render_table();
        if std::env::var("UPDATE_SNAPSHOTS").as_deref() == Ok("1") {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &actual).unwrap();
            return;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {}: {e}\nrun `UPDATE_SNAPSHOTS=1 cargo test -p softrdma-core` to create it",
                path.display()
            )
        });
        if expected == actual {
            return;
        }
        let (line, want, got) = expected
            .lines()
            .map(Some)
            .chain(std::iter::repeat(None))
            .zip(actual.lines().map(Some).chain(std::iter::repeat(None)))
            .enumerate()
            .find(|(_, (w, g))| w != g)
            .map(|(i, (w, g))| (i + 1, w.unwrap_or("<end>"), g.unwrap_or("<end>")))
            .expect("texts differ, so some line differs");
        panic!(
            "the QP transition table no longer matches {}\n\
             first difference at line {line}:\n  snapshot: {want}\n  table:    {got}\n\
             if the change is intended, rerun with UPDATE_SNAPSHOTS=1 and review `git diff crates/core/{SNAPSHOT}`",
            path.display()
        );
    }

    #[test]
    fn rows_are_unique_and_masks_are_named_bits() {
        for (i, a) in TRANSITIONS.iter().enumerate() {
            for b in &TRANSITIONS[i + 1..] {
                assert!(
                    (a.from, a.to) != (b.from, b.to),
                    "{}->{} listed twice",
                    a.from,
                    a.to
                );
            }
            for qp_type in QpType::ALL {
                if let Some(rule) = a.rule(qp_type) {
                    assert!(AttrMask::ALL.contains(rule.allowed()));
                    assert!(!rule.required.intersects(rule.optional));
                    assert!(!rule
                        .allowed()
                        .intersects(AttrMask::RATE_LIMIT | AttrMask::CAP));
                }
            }
        }
    }

    /// The kernel separately refuses CUR_STATE unless the QP is in RTR, RTS,
    /// SQD or SQE; the table must already encode that.
    #[test]
    fn cur_state_only_from_rtr_rts_sqd_sqe() {
        for t in TRANSITIONS {
            for qp_type in QpType::ALL {
                if let Some(rule) = t.rule(qp_type) {
                    if rule.optional.contains(AttrMask::CUR_STATE) {
                        assert!(
                            matches!(t.from, Rtr | Rts | Sqd | Sqe),
                            "{}->{}",
                            t.from,
                            t.to
                        );
                    }
                    assert!(!rule.required.contains(AttrMask::CUR_STATE));
                }
            }
        }
    }

    #[test]
    fn ibv_values_round_trip() {
        for (i, s) in QpState::ALL.into_iter().enumerate() {
            assert_eq!(s.to_ibv(), i as u32);
            assert_eq!(QpState::from_ibv(i as u32), Some(s));
        }
        assert_eq!(QpState::from_ibv(7), None);
        for (t, v) in QpType::ALL.into_iter().zip([2, 3, 4]) {
            assert_eq!(t.to_ibv(), v);
            assert_eq!(QpType::from_ibv(v), Some(t));
        }
        assert_eq!(QpType::from_ibv(1), None);
    }

    #[test]
    fn every_missing_required_bit_is_reported() {
        for t in TRANSITIONS {
            for qp_type in QpType::ALL {
                let Some(rule) = t.rule(qp_type) else {
                    continue;
                };
                let full = rule.required | AttrMask::STATE;
                assert_eq!(check_modify(t.from, qp_type, full, Some(t.to)), Ok(t.to));
                for bit in rule.required.iter() {
                    assert_eq!(
                        check_modify(t.from, qp_type, full.difference(bit), Some(t.to)),
                        Err(ModifyError::MissingAttributes {
                            from: t.from,
                            to: t.to,
                            qp_type,
                            missing: bit
                        })
                    );
                }
                if !rule.required.is_empty() {
                    assert_eq!(
                        check_modify(t.from, qp_type, AttrMask::STATE, Some(t.to)),
                        Err(ModifyError::MissingAttributes {
                            from: t.from,
                            to: t.to,
                            qp_type,
                            missing: rule.required
                        })
                    );
                }
            }
        }
    }

    #[test]
    fn every_extra_bit_is_reported() {
        for t in TRANSITIONS {
            for qp_type in QpType::ALL {
                let Some(rule) = t.rule(qp_type) else {
                    continue;
                };
                let full = rule.allowed();
                assert_eq!(check_modify(t.from, qp_type, full, Some(t.to)), Ok(t.to));
                let strays = AttrMask::ALL
                    .difference(full)
                    .union(AttrMask::from_bits_retain(1 << 30));
                for bit in strays.iter() {
                    assert_eq!(
                        check_modify(t.from, qp_type, full | bit, Some(t.to)),
                        Err(ModifyError::UnsupportedAttributes {
                            from: t.from,
                            to: t.to,
                            qp_type,
                            extra: bit
                        })
                    );
                }
            }
        }
    }

    #[test]
    fn error_messages_name_the_problem() {
        let rc_rtr = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        let err = check_modify(Init, QpType::Rc, rc_rtr, Some(Rtr)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "INIT->RTR for RC QP requires PATH_MTU|DEST_QPN"
        );

        let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        let err = check_modify(
            Reset,
            QpType::Rc,
            mask | AttrMask::ACCESS_FLAGS | AttrMask::QKEY,
            Some(Init),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "RESET->INIT for RC QP does not take QKEY (it takes STATE|ACCESS_FLAGS|PKEY_INDEX|PORT)"
        );

        let err = check_modify(Reset, QpType::Ud, AttrMask::STATE, Some(Rts)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "RESET->RTS is not a valid transition for UD QP"
        );

        let err = check_modify(Rtr, QpType::Rc, AttrMask::MIN_RNR_TIMER, None).unwrap_err();
        assert!(err
            .to_string()
            .contains("cannot have attributes modified without a state change"));

        let err = check_modify(Rts, QpType::Rc, AttrMask::STATE, None).unwrap_err();
        assert_eq!(
            err,
            ModifyError::MissingTargetState {
                from: Rts,
                qp_type: QpType::Rc
            }
        );
        assert!(err.to_string().contains("no target state"));
    }

    #[test]
    fn reset_to_rts_is_invalid() {
        for qp_type in QpType::ALL {
            let everything = AttrMask::ALL;
            assert_eq!(
                check_modify(Reset, qp_type, everything, Some(Rts)),
                Err(ModifyError::InvalidTransition {
                    from: Reset,
                    to: Rts,
                    qp_type
                })
            );
        }
    }

    #[test]
    fn any_state_to_reset_or_err_is_valid_with_state_only() {
        for qp_type in QpType::ALL {
            for from in QpState::ALL {
                for to in [Reset, QpState::Err] {
                    assert_eq!(
                        check_modify(from, qp_type, AttrMask::STATE, Some(to)),
                        Ok(to)
                    );
                }
            }
        }
        assert_eq!(
            check_modify(QpState::Err, QpType::Rc, AttrMask::STATE, Some(Reset)),
            Ok(Reset)
        );
        // Teardown takes no other attributes, CUR_STATE included.
        assert!(matches!(
            check_modify(
                Rts,
                QpType::Rc,
                AttrMask::STATE | AttrMask::CUR_STATE,
                Some(QpState::Err)
            ),
            Err(ModifyError::UnsupportedAttributes { .. })
        ));
    }

    #[test]
    fn no_state_bit_modifies_in_place() {
        // RTS->RTS exists: change access flags without a state change.
        assert_eq!(
            check_modify(Rts, QpType::Rc, AttrMask::ACCESS_FLAGS, Some(QpState::Err)),
            Ok(Rts)
        );
        assert_eq!(
            check_modify(Init, QpType::Ud, AttrMask::QKEY, None),
            Ok(Init)
        );
        // RTR->RTR does not.
        assert_eq!(
            check_modify(Rtr, QpType::Uc, AttrMask::ACCESS_FLAGS, None),
            Err(ModifyError::InvalidTransition {
                from: Rtr,
                to: Rtr,
                qp_type: QpType::Uc
            })
        );
        // SQE is recovered only by a modify to RTS, and RC never has it.
        assert_eq!(
            check_modify(Sqe, QpType::Rc, AttrMask::STATE, Some(Rts)),
            Err(ModifyError::InvalidTransition {
                from: Sqe,
                to: Rts,
                qp_type: QpType::Rc
            })
        );
        assert_eq!(
            check_modify(Sqe, QpType::Ud, AttrMask::STATE, Some(Rts)),
            Ok(Rts)
        );
    }

    /// The masks rdma-core's pingpong examples and perftest pass, step by
    /// step, for each QP type.
    #[test]
    fn usual_bring_up_sequences_succeed() {
        use AttrMask as M;
        let rc = [
            (Init, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
            (
                Rtr,
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
            ),
            (
                Rts,
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
            ),
        ];
        let uc = [
            (Init, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
            (Rtr, M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN),
            (Rts, M::SQ_PSN),
        ];
        let ud = [
            (Init, M::PKEY_INDEX | M::PORT | M::QKEY),
            (Rtr, M::EMPTY),
            (Rts, M::SQ_PSN),
        ];
        for (qp_type, steps) in [(QpType::Rc, rc), (QpType::Uc, uc), (QpType::Ud, ud)] {
            let mut state = Reset;
            for (to, attrs) in steps {
                state = check_modify(state, qp_type, attrs | M::STATE, Some(to))
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(state, to);
            }
        }
    }

    proptest! {
        /// check_modify succeeds exactly when the transition exists for the
        /// type and required ⊆ mask ⊆ required ∪ optional ∪ STATE. Masks are
        /// drawn near the rule (required, a random part of optional, one
        /// flipped bit) as well as at random, so both outcomes are common.
        #[test]
        fn check_modify_accepts_exactly_the_rule(
            cur in 0u32..7,
            to in 0u32..7,
            ty in 0usize..5,
            with_state in any::<bool>(),
            near_rule in any::<bool>(),
            pick in any::<u32>(),
            flip in prop::option::of(0u32..32),
        ) {
            let cur = QpState::from_ibv(cur).unwrap();
            let to = QpState::from_ibv(to).unwrap();
            let qp_type = QpType::ALL[ty];
            let intended = if with_state { to } else { cur };
            let mut bits = match transition_rule(cur, intended, qp_type) {
                Some(rule) if near_rule => rule.required.bits() | (rule.optional.bits() & pick),
                _ => pick,
            };
            if with_state {
                bits |= AttrMask::STATE.bits();
            } else {
                bits &= !AttrMask::STATE.bits();
            }
            if let Some(i) = flip {
                bits ^= 1 << i;
            }
            let mask = AttrMask::from_bits_retain(bits);

            let next = if mask.contains(AttrMask::STATE) { to } else { cur };
            let expected = match transition_rule(cur, next, qp_type) {
                None => Err("invalid"),
                Some(rule) if !mask.contains(rule.required) => Err("missing"),
                Some(rule) if !rule.allowed().contains(mask) => Err("extra"),
                Some(_) => Ok(next),
            };
            let got = check_modify(cur, qp_type, mask, Some(to)).map_err(|e| match e {
                ModifyError::InvalidTransition { .. } => "invalid",
                ModifyError::MissingAttributes { .. } => "missing",
                ModifyError::UnsupportedAttributes { .. } => "extra",
                ModifyError::MissingTargetState { .. } => "no target",
            });
            prop_assert_eq!(got, expected);
        }
    }
}
