//! Element types and reduction operators for collectives (AllReduce,
//! ReduceScatter, Reduce), named as nccl-tests names them.
//!
//! The kernels work on raw byte ranges, never on Rust references, because the
//! buffers are typically registered memory that a peer (or the NIC emulation
//! of another process) may write at any time. Each kernel copies a block of
//! [`BLOCK`] elements from raw memory into local stack arrays, reduces the
//! arrays with a plain loop that the compiler vectorises (one instantiation
//! per element type and operator, the operator chosen once per call, outside
//! the loop), and copies the block back.
//!
//! # Semantics
//!
//! * Integers: `Sum`, `Prod` and `Avg` (which accumulates like `Sum`) wrap on
//!   overflow; `Min`/`Max` are the usual ordered minimum and maximum.
//! * `Float`/`Double`: each operator is computed in the type's own arithmetic.
//! * `Half`/`Bfloat16`: each operator converts both operands to `f32`,
//!   computes in `f32` and rounds the result back to the 16-bit type, round
//!   to nearest, ties to even (exactly what [`half::f16::from_f32`] and
//!   [`half::bf16::from_f32`] do).
//! * `Min`/`Max` of floating point values follow IEEE 754 `minNum`/`maxNum`
//!   (as [`f32::min`] and C's `fminf`, which NCCL uses): when exactly one
//!   operand is NaN the other operand is the result, so a NaN only survives
//!   when both operands are NaN. The sign of a zero result of `min(-0.0,
//!   +0.0)` is unspecified.
//! * `Avg` is finished once, by [`finish`], after the whole sum is in place.

use core::mem::size_of;
use core::ptr;

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Element type of a collective's buffers, as nccl-tests names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// Signed 8-bit integer (`int8`, alias `char`).
    Int8,
    /// Unsigned 8-bit integer (`uint8`).
    Uint8,
    /// Signed 32-bit integer (`int32`, alias `int`).
    Int32,
    /// Unsigned 32-bit integer (`uint32`).
    Uint32,
    /// Signed 64-bit integer (`int64`).
    Int64,
    /// Unsigned 64-bit integer (`uint64`).
    Uint64,
    /// IEEE 754 binary16 (`half`, aliases `float16`, `fp16`).
    Half,
    /// IEEE 754 binary32 (`float`, aliases `float32`, `fp32`).
    Float,
    /// IEEE 754 binary64 (`double`, aliases `float64`, `fp64`).
    Double,
    /// bfloat16 (`bfloat16`, alias `bf16`).
    Bfloat16,
}

impl DataType {
    /// Every data type, in nccl-tests order.
    pub const ALL: [DataType; 10] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Half,
        DataType::Float,
        DataType::Double,
        DataType::Bfloat16,
    ];

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Half | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Double => 8,
        }
    }

    /// The nccl-tests name of the type (`"int8"`, ..., `"bfloat16"`).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Half => "half",
            DataType::Float => "float",
            DataType::Double => "double",
            DataType::Bfloat16 => "bfloat16",
        }
    }

    /// Parses a name as printed by [`DataType::name`] or one of the
    /// nccl-tests aliases (`char`, `int`, `float16`, `fp16`, `float32`,
    /// `fp32`, `float64`, `fp64`, `bf16`). Matching is exact (case
    /// sensitive); `"all"` is not a type and yields `None` (use
    /// [`DataType::ALL`]).
    pub fn parse(s: &str) -> Option<DataType> {
        Some(match s {
            "int8" | "char" => DataType::Int8,
            "uint8" => DataType::Uint8,
            "int32" | "int" => DataType::Int32,
            "uint32" => DataType::Uint32,
            "int64" => DataType::Int64,
            "uint64" => DataType::Uint64,
            "half" | "float16" | "fp16" => DataType::Half,
            "float" | "float32" | "fp32" => DataType::Float,
            "double" | "float64" | "fp64" => DataType::Double,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            _ => return None,
        })
    }
}

/// Reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Minimum (`minNum` for floats: a NaN loses against a number).
    Min,
    /// Maximum (`maxNum` for floats: a NaN loses against a number).
    Max,
    /// Average: accumulated like [`ReduceOp::Sum`] by [`reduce_into`] and
    /// [`reduce3`], then divided by the number of ranks by [`finish`].
    Avg,
}

impl ReduceOp {
    /// Every operator, in nccl-tests order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The nccl-tests name of the operator (`"sum"`, `"prod"`, `"min"`,
    /// `"max"`, `"avg"`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Parses a name as printed by [`ReduceOp::name`] (exact match; `"all"`
    /// yields `None`, use [`ReduceOp::ALL`]).
    pub fn parse(s: &str) -> Option<ReduceOp> {
        Some(match s {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" => ReduceOp::Avg,
            _ => return None,
        })
    }
}

/// Units (see [`Unit`]) a kernel moves between raw memory and its local
/// arrays at a time.
const BLOCK: usize = 32;

/// Arithmetic of one compute type, with the semantics documented at the top
/// of the module.
trait Arith: Copy {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                Ord::max(self, o)
            }
        }
    )*};
}
arith_int!(i8, u8, i32, u32, i64, u64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                <$t>::min(self, o)
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                <$t>::max(self, o)
            }
        }
    )*};
}
arith_float!(f32, f64);

/// A reduction operator, as a zero-sized type so that each kernel is
/// monomorphised for it and the choice is made once per call.
trait Op {
    fn apply<A: Arith>(a: A, b: A) -> A;
}

struct OpSum;
struct OpProd;
struct OpMin;
struct OpMax;

impl Op for OpSum {
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.add(b)
    }
}
impl Op for OpProd {
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.mul(b)
    }
}
impl Op for OpMin {
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.min(b)
    }
}
impl Op for OpMax {
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.max(b)
    }
}

/// The storage unit a kernel works on: one element of a native type, or a
/// pair of 16-bit floats packed in a `u32` (element `2k` in the low half, as
/// little-endian memory lays them out), which keeps the conversions in
/// 32-bit lanes, free of shuffles.
///
/// # Safety
///
/// Implementors must be plain old data for which every bit pattern of
/// `size_of::<Self>()` bytes is a valid value, and `size_of::<Self>()` must
/// be a multiple of the element size: the kernels fill local arrays of
/// `Self` by copying arbitrary bytes, and possibly a partial last unit,
/// into them.
unsafe trait Unit: Copy {
    /// A unit whose elements are all zero.
    const ZERO: Self;
    /// Working space a kernel allocates once (on its stack) and lends to
    /// every block.
    type Scratch: Copy;
    /// Initial value of the scratch space.
    const SCRATCH: Self::Scratch;
    /// `x[i] = op(x[i], y[i])` for every element of the block.
    fn block<O: Op>(x: &mut [Self; BLOCK], y: &[Self; BLOCK], s: &mut Self::Scratch);
    /// `x[i] = x[i] / n` (the `Avg` finish) for every element of the block;
    /// `n >= 1`.
    fn div_block(x: &mut [Self; BLOCK], n: usize, s: &mut Self::Scratch);
}

macro_rules! unit_native {
    ($($t:ty => $zero:expr, |$v:ident, $n:ident| $div:expr;)*) => {$(
        // SAFETY: a primitive integer or float, one element per unit; every
        // bit pattern is valid.
        unsafe impl Unit for $t {
            const ZERO: Self = $zero;
            type Scratch = ();
            const SCRATCH: () = ();
            #[inline(always)]
            fn block<O: Op>(x: &mut [Self; BLOCK], y: &[Self; BLOCK], _: &mut ()) {
                for (a, b) in x.iter_mut().zip(y.iter()) {
                    *a = O::apply(*a, *b);
                }
            }
            #[inline(always)]
            fn div_block(x: &mut [Self; BLOCK], n: usize, _: &mut ()) {
                let $n = n;
                for a in x.iter_mut() {
                    let $v = *a;
                    *a = $div;
                }
            }
        }
    )*};
}

// Truncating division of integers of up to 32 bits goes through f64, where
// it vectorises (integer division does not) and is exact: the `as` cast
// truncates towards zero, and with |v| < 2^32 a quotient v/n that is not an
// integer lies at least 1/n >= 2^-32 (relative to |v/n|) below the next
// integer in magnitude, far more than f64's rounding error of 2^-53, so
// rounding never lifts it onto that integer. `n as f64` is exact up to 2^53;
// beyond that every quotient truncates to 0 either way.
unit_native! {
    i8 => 0, |v, n| (f64::from(v) / n as f64) as i8;
    u8 => 0, |v, n| (f64::from(v) / n as f64) as u8;
    i32 => 0, |v, n| (f64::from(v) / n as f64) as i32;
    u32 => 0, |v, n| (f64::from(v) / n as f64) as u32;
    i64 => 0, |v, n| match i64::try_from(n) {
        Ok(n) => v / n,
        // n > i64::MAX: only i64::MIN / 2^63 is nonzero.
        Err(_) => (i128::from(v) / n as i128) as i64,
    };
    u64 => 0, |v, n| v / n as u64;
    f32 => 0.0, |v, n| v / n as f32;
    f64 => 0.0, |v, n| v / n as f64;
}

/// Two bfloat16 values (`half::bf16` bits), element `2k` in the low half.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Bf16x2(u32);

/// Number of binary16 elements per unit.
const F16_PER_UNIT: usize = 4;

// SAFETY: an array of `f16`, which is `repr(transparent)` over `u16`; every
// bit pattern is a valid value, and the unit is a whole number of elements.
unsafe impl Unit for [f16; F16_PER_UNIT] {
    const ZERO: Self = [f16::ZERO; F16_PER_UNIT];
    type Scratch = [[f32; BLOCK * F16_PER_UNIT]; 2];
    const SCRATCH: Self::Scratch = [[0.0; BLOCK * F16_PER_UNIT]; 2];
    #[inline(always)]
    fn block<O: Op>(x: &mut [Self; BLOCK], y: &[Self; BLOCK], s: &mut Self::Scratch) {
        // `half`'s slice conversions use F16C (x86) or FP16 (aarch64)
        // instructions when the CPU has them, detected at run time.
        let [fx, fy] = s;
        x.as_flattened().convert_to_f32_slice(fx);
        y.as_flattened().convert_to_f32_slice(fy);
        for (a, b) in fx.iter_mut().zip(fy.iter()) {
            *a = O::apply(*a, *b);
        }
        x.as_flattened_mut().convert_from_f32_slice(fx);
    }
    #[inline(always)]
    fn div_block(x: &mut [Self; BLOCK], n: usize, s: &mut Self::Scratch) {
        let fx = &mut s[0];
        x.as_flattened().convert_to_f32_slice(fx);
        let d = n as f32;
        for a in fx.iter_mut() {
            *a /= d;
        }
        x.as_flattened_mut().convert_from_f32_slice(fx);
    }
}

// SAFETY: a `u32` holding two 2-byte elements; every bit pattern is valid
// (any 16 bits are a bf16).
unsafe impl Unit for Bf16x2 {
    const ZERO: Self = Bf16x2(0);
    type Scratch = ();
    const SCRATCH: () = ();
    #[inline(always)]
    fn block<O: Op>(x: &mut [Self; BLOCK], y: &[Self; BLOCK], _: &mut ()) {
        for (a, b) in x.iter_mut().zip(y.iter()) {
            let lo = O::apply(f32::from_bits(a.0 << 16), f32::from_bits(b.0 << 16));
            let hi = O::apply(
                f32::from_bits(a.0 & 0xFFFF_0000),
                f32::from_bits(b.0 & 0xFFFF_0000),
            );
            *a = Bf16x2(f32_to_bf16(lo) | (f32_to_bf16(hi) << 16));
        }
    }
    #[inline(always)]
    fn div_block(x: &mut [Self; BLOCK], n: usize, _: &mut ()) {
        let d = n as f32;
        for a in x.iter_mut() {
            let lo = f32_to_bf16(f32::from_bits(a.0 << 16) / d);
            let hi = f32_to_bf16(f32::from_bits(a.0 & 0xFFFF_0000) / d);
            *a = Bf16x2(lo | (hi << 16));
        }
    }
}

// Branch-free conversions between the 16-bit float formats and f32, written
// with selects only so that the block loops above vectorise with plain SSE2.
// For every non-NaN value they give exactly the bits `half` gives (round to
// nearest, ties to even; the tests check this exhaustively for f16 -> f32 and
// on a dense sample of f32 -> f16/bf16). NaN stays NaN: a NaN result is
// always quiet, with the top payload bits of the f32 NaN, as in `half`; on
// the way in NaNs are not quieted (the f32 arithmetic or conversion does
// that), so a signalling NaN input may come out with a different payload
// than a round trip through `half` would give.

/// f32 to bfloat16 bits (in the low 16 bits of the result), round to
/// nearest, ties to even; NaN keeps its top payload bits and is made quiet.
#[inline(always)]
fn f32_to_bf16(f: f32) -> u32 {
    let x = f.to_bits();
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    let nan = (x >> 16) | 0x40;
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }
}

/// `dst = op(a, b)` over `bytes` bytes of units `U`, block by block.
///
/// # Safety
///
/// `a` and `b` valid for reads and `dst` valid for writes of `bytes` bytes
/// (any alignment); `bytes` a multiple of the element size; `dst` may equal
/// `a` or `b` but must not partially overlap either.
#[inline(never)]
unsafe fn kernel<U: Unit, O: Op>(dst: *mut u8, a: *const u8, b: *const u8, bytes: usize) {
    let block_bytes = BLOCK * size_of::<U>();
    let full = bytes / block_bytes;
    let mut scratch = U::SCRATCH;
    for i in 0..full {
        let off = i * block_bytes;
        // SAFETY: block `i < bytes / block_bytes` lies within the first
        // `bytes` bytes of `a` and `b`, which the caller guarantees readable;
        // unaligned reads need no alignment, and any bytes are a valid
        // `[U; BLOCK]` (Unit's contract).
        let (mut x, y) = unsafe {
            (
                ptr::read_unaligned(a.add(off).cast::<[U; BLOCK]>()),
                ptr::read_unaligned(b.add(off).cast::<[U; BLOCK]>()),
            )
        };
        U::block::<O>(&mut x, &y, &mut scratch);
        // SAFETY: the same block of `dst` is writable (caller's contract);
        // both inputs of the block were read into locals above, so `dst`
        // exactly aliasing `a` or `b` cannot feed back into this block, and
        // no other block overlaps it.
        unsafe { ptr::write_unaligned(dst.add(off).cast::<[U; BLOCK]>(), x) };
    }
    let rem = bytes % block_bytes;
    if rem != 0 {
        let off = full * block_bytes;
        let mut x = [U::ZERO; BLOCK];
        let mut y = [U::ZERO; BLOCK];
        // SAFETY: the tail `[off, off + rem)` ends at `bytes`, inside the
        // caller-guaranteed ranges, and `rem < block_bytes` fits the local
        // arrays, which overlap nothing the caller owns; any bytes are valid
        // units (Unit's contract). Lanes past `rem` stay zero: they are
        // computed on but never stored.
        unsafe {
            ptr::copy_nonoverlapping(a.add(off), x.as_mut_ptr().cast::<u8>(), rem);
            ptr::copy_nonoverlapping(b.add(off), y.as_mut_ptr().cast::<u8>(), rem);
        }
        U::block::<O>(&mut x, &y, &mut scratch);
        // SAFETY: as above, `dst` is writable over the tail.
        unsafe { ptr::copy_nonoverlapping(x.as_ptr().cast::<u8>(), dst.add(off), rem) };
    }
}

/// `buf = buf / nranks` over `bytes` bytes of units `U`.
///
/// # Safety
///
/// `buf` valid for reads and writes of `bytes` bytes (any alignment);
/// `bytes` a multiple of the element size; `nranks >= 1`.
#[inline(never)]
unsafe fn div_kernel<U: Unit>(buf: *mut u8, bytes: usize, nranks: usize) {
    let block_bytes = BLOCK * size_of::<U>();
    let full = bytes / block_bytes;
    let mut scratch = U::SCRATCH;
    for i in 0..full {
        let p = buf.wrapping_add(i * block_bytes).cast::<[U; BLOCK]>();
        // SAFETY: block `i < bytes / block_bytes` lies within the caller's
        // `bytes` readable and writable bytes; unaligned accesses need no
        // alignment; any bytes are a valid `[U; BLOCK]` (Unit's contract).
        let mut x = unsafe { ptr::read_unaligned(p) };
        U::div_block(&mut x, nranks, &mut scratch);
        // SAFETY: as above.
        unsafe { ptr::write_unaligned(p, x) };
    }
    let rem = bytes % block_bytes;
    if rem != 0 {
        let p = buf.wrapping_add(full * block_bytes);
        let mut x = [U::ZERO; BLOCK];
        // SAFETY: the tail `[full * block_bytes, bytes)` lies within the
        // caller's range; `rem < block_bytes` fits the local array; any
        // bytes are valid units.
        unsafe { ptr::copy_nonoverlapping(p, x.as_mut_ptr().cast::<u8>(), rem) };
        U::div_block(&mut x, nranks, &mut scratch);
        // SAFETY: as above.
        unsafe { ptr::copy_nonoverlapping(x.as_ptr().cast::<u8>(), p, rem) };
    }
}

/// Runs `kernel::<U, op>`, choosing the operator once, outside the loop.
///
/// # Safety
///
/// As [`kernel`].
#[inline(always)]
unsafe fn dispatch_op<U: Unit>(
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    bytes: usize,
) {
    // SAFETY: forwarded unchanged from the caller, who upholds `kernel`'s
    // contract.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => kernel::<U, OpSum>(dst, a, b, bytes),
            ReduceOp::Prod => kernel::<U, OpProd>(dst, a, b, bytes),
            ReduceOp::Min => kernel::<U, OpMin>(dst, a, b, bytes),
            ReduceOp::Max => kernel::<U, OpMax>(dst, a, b, bytes),
        }
    }
}

/// `acc[i] = op(acc[i], src[i])` for each of the `n` elements of type `dt`
/// at the raw byte ranges `acc` and `src` (any alignment, native
/// little-endian layout). [`ReduceOp::Avg`] accumulates like
/// [`ReduceOp::Sum`]; the division happens once, in [`finish`].
///
/// The buffers are only ever accessed through raw pointer copies, never
/// through references, so they may be memory that another process or an
/// RDMA peer writes concurrently; bytes written while the call runs may be
/// seen either way (the result is then meaningless, but nothing else goes
/// wrong). Each element of `acc` is read once and written once, in address
/// order within blocks of 64 units.
///
/// # Safety
///
/// `acc` must be valid for reads and writes, and `src` valid for reads, of
/// `n * dt.size()` bytes. `src` may be exactly `acc` but must not otherwise
/// overlap it.
pub unsafe fn reduce_into(dt: DataType, op: ReduceOp, acc: *mut u8, src: *const u8, n: usize) {
    // SAFETY: `acc` is readable and writable and `src` readable over
    // `n * dt.size()` bytes (this function's contract); `acc` as both `dst`
    // and `a` is an exact alias, which `reduce3` allows, and `src` may only
    // alias them exactly.
    unsafe { reduce3(dt, op, acc, acc.cast_const(), src, n) }
}

/// `dst[i] = op(a[i], b[i])` for each of the `n` elements of type `dt`:
/// the out-of-place form of [`reduce_into`], with the same rules.
///
/// # Safety
///
/// `a` and `b` must be valid for reads and `dst` valid for writes of
/// `n * dt.size()` bytes. `dst` may be exactly `a` or exactly `b` (alias),
/// but must not partially overlap either of them.
pub unsafe fn reduce3(
    dt: DataType,
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
) {
    // The ranges are valid allocations of `n * dt.size()` bytes, so this
    // cannot overflow.
    let bytes = n * dt.size();
    // SAFETY: the caller guarantees `bytes = n * dt.size()` readable bytes
    // at `a` and `b` and writable bytes at `dst`, aliasing only exactly;
    // each arm's unit size is a multiple of `dt.size()`, so `bytes` is a
    // multiple of the element size as `kernel` requires.
    unsafe {
        match dt {
            DataType::Int8 => dispatch_op::<i8>(op, dst, a, b, bytes),
            DataType::Uint8 => dispatch_op::<u8>(op, dst, a, b, bytes),
            DataType::Int32 => dispatch_op::<i32>(op, dst, a, b, bytes),
            DataType::Uint32 => dispatch_op::<u32>(op, dst, a, b, bytes),
            DataType::Int64 => dispatch_op::<i64>(op, dst, a, b, bytes),
            DataType::Uint64 => dispatch_op::<u64>(op, dst, a, b, bytes),
            DataType::Half => dispatch_op::<[f16; F16_PER_UNIT]>(op, dst, a, b, bytes),
            DataType::Float => dispatch_op::<f32>(op, dst, a, b, bytes),
            DataType::Double => dispatch_op::<f64>(op, dst, a, b, bytes),
            DataType::Bfloat16 => dispatch_op::<Bf16x2>(op, dst, a, b, bytes),
        }
    }
}

/// Finishes a reduction in place: for [`ReduceOp::Avg`], divides each of the
/// `n` elements at `buf` by `nranks`; for every other operator, does nothing.
///
/// Integers (whose sum has already wrapped) use truncating division, signed
/// types as signed (`-7 / 2 == -3`). `Float` divides in `f32`, `Double` in
/// `f64`; `Half` and `Bfloat16` convert to `f32`, divide, and round back to
/// nearest even.
///
/// # Panics
///
/// If `op` is `Avg` and `nranks` is 0.
///
/// # Safety
///
/// `buf` must be valid for reads and writes of `n * dt.size()` bytes (any
/// alignment); as with [`reduce_into`], it is accessed through raw pointer
/// copies only.
pub unsafe fn finish(dt: DataType, op: ReduceOp, buf: *mut u8, n: usize, nranks: usize) {
    if op != ReduceOp::Avg {
        return;
    }
    assert!(nranks > 0, "ReduceOp::Avg finished over 0 ranks");
    if nranks == 1 {
        return;
    }
    let bytes = n * dt.size();
    // SAFETY: the caller guarantees `bytes = n * dt.size()` readable and
    // writable bytes at `buf`; each arm's unit size is a multiple of
    // `dt.size()`; `nranks >= 1` was checked above.
    unsafe {
        match dt {
            DataType::Int8 => div_kernel::<i8>(buf, bytes, nranks),
            DataType::Uint8 => div_kernel::<u8>(buf, bytes, nranks),
            DataType::Int32 => div_kernel::<i32>(buf, bytes, nranks),
            DataType::Uint32 => div_kernel::<u32>(buf, bytes, nranks),
            DataType::Int64 => div_kernel::<i64>(buf, bytes, nranks),
            DataType::Uint64 => div_kernel::<u64>(buf, bytes, nranks),
            DataType::Half => div_kernel::<[f16; F16_PER_UNIT]>(buf, bytes, nranks),
            DataType::Float => div_kernel::<f32>(buf, bytes, nranks),
            DataType::Double => div_kernel::<f64>(buf, bytes, nranks),
            DataType::Bfloat16 => div_kernel::<Bf16x2>(buf, bytes, nranks),
        }
    }
}
