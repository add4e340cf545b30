//! Element types and reduction operators for collectives (AllReduce,
//! ReduceScatter, Reduce), named as nccl-tests names them, and the kernels
//! that apply them to raw buffers.
//!
//! # Memory access
//!
//! The kernels take raw byte pointers and never form Rust references over
//! the caller's buffers, because those are typically registered memory that
//! a peer or another process may write at any time. Each kernel reads a
//! fixed-size block (32 units of 1 to 8 bytes) from each input with
//! unaligned raw reads into local arrays, reduces the arrays with a plain
//! loop that the compiler vectorises (one instantiation per element type
//! and operator; the operator is chosen once per call, outside the loop),
//! and writes the block back with one unaligned raw write (the F16C kernel
//! for `Half` does the same with 16-byte vector loads and stores). The last
//! partial block goes through zero-padded local arrays. Nothing is allocated
//! on the heap, and nothing is assumed about alignment.
//!
//! # Semantics
//!
//! * Integers: `Sum`, `Prod` and `Avg` (which accumulates like `Sum`) wrap on
//!   overflow; `Min`/`Max` are the usual ordered minimum and maximum.
//! * `Float`/`Double`: each operator is computed in the type's own arithmetic.
//! * `Half`/`Bfloat16`: each operator converts both operands to `f32`,
//!   computes in `f32` and rounds the result back to the 16-bit type, to
//!   nearest, ties to even, with exactly the bits [`half::f16::from_f32`] and
//!   [`half::bf16::from_f32`] give (for non-NaN results). `Half` runs, on
//!   x86-64 CPUs with F16C and AVX (detected at run time, once), a kernel
//!   that converts eight elements per instruction; elsewhere, and for the
//!   last partial block, it goes through `half`'s slice conversions (which
//!   use F16C or aarch64's FP16 instructions themselves when they can).
//!   `Bfloat16` uses a branch-free conversion of this module's own that
//!   vectorises (checked against `half`).
//! * `Min`/`Max` of floating point values follow IEEE 754 `minNum`/`maxNum`,
//!   like [`f32::min`] and C's `fminf` (which NCCL uses): when exactly one
//!   operand is NaN the result is the other operand, so a NaN survives only
//!   when both operands are NaN. Which zero `min(-0.0, +0.0)` returns is
//!   unspecified.
//! * `Sum`/`Prod` propagate NaN. Which NaN a NaN result is (payload, quiet
//!   bit) is whatever the hardware gives, so it is not specified.
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
            // IEEE minNum/maxNum: the other operand when one is NaN.
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
    /// Which operator this is (never `Avg`), for kernels that spell the
    /// operation out themselves.
    const KIND: ReduceOp;
    fn apply<A: Arith>(a: A, b: A) -> A;
}

struct OpSum;
struct OpProd;
struct OpMin;
struct OpMax;

impl Op for OpSum {
    const KIND: ReduceOp = ReduceOp::Sum;
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.add(b)
    }
}
impl Op for OpProd {
    const KIND: ReduceOp = ReduceOp::Prod;
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.mul(b)
    }
}
impl Op for OpMin {
    const KIND: ReduceOp = ReduceOp::Min;
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.min(b)
    }
}
impl Op for OpMax {
    const KIND: ReduceOp = ReduceOp::Max;
    #[inline(always)]
    fn apply<A: Arith>(a: A, b: A) -> A {
        a.max(b)
    }
}

/// The storage unit a kernel works on: one element of a native type, a
/// small array of `f16` (so that each call of `half`'s slice conversions does
/// more work), or a pair of `bf16` packed in a `u32` (element `2k` in the low
/// half, as little-endian memory lays them out), which keeps the conversions
/// in 32-bit lanes, free of shuffles.
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

// Truncating division of 8- and 32-bit integers goes through f32 and f64
// respectively, where it vectorises (integer division does not) and is
// exact: the `as` cast truncates towards zero, and with |v| < 2^8 (resp.
// 2^32) a quotient v/n that is not an integer lies at least 1/n, so at least
// 2^-8 (resp. 2^-32) relative to |v/n|, below the next integer in magnitude,
// far more than the rounding error of 2^-24 (resp. 2^-53), so rounding never
// lifts it onto that integer. `n` converts exactly up to 2^24 (resp. 2^53);
// beyond that every quotient truncates to 0 either way.
unit_native! {
    i8 => 0, |v, n| (f32::from(v) / n as f32) as i32 as i8;
    u8 => 0, |v, n| (f32::from(v) / n as f32) as i32 as u8;
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

// bfloat16 <-> f32. From bf16, the 16 bits simply become the top half of the
// f32 (NaNs are not quieted on the way in, unlike `half::bf16::to_f32`; the
// f32 arithmetic or the conversion back quiets them). To bf16, a branch-free
// round to nearest, ties to even, written with a select so that the block
// loops vectorise with plain SSE2; for every f32 it gives exactly the bits of
// `half::bf16::from_f32` (checked exhaustively once, over all 2^32 inputs,
// and on a dense sample in the tests).

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

/// The `Half` kernel: whole blocks through F16C when the CPU has it, the
/// rest (or everything, elsewhere) through `half`'s slice conversions.
///
/// # Safety
///
/// As [`kernel`], over `n` binary16 elements (`2 * n` bytes).
#[inline(always)]
unsafe fn dispatch_half(op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    let done = if f16c::available() {
        // SAFETY: the CPU has F16C and AVX (just checked); the ranges are
        // the caller's, forwarded unchanged.
        unsafe {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => f16c::kernel::<OpSum>(dst, a, b, n),
                ReduceOp::Prod => f16c::kernel::<OpProd>(dst, a, b, n),
                ReduceOp::Min => f16c::kernel::<OpMin>(dst, a, b, n),
                ReduceOp::Max => f16c::kernel::<OpMax>(dst, a, b, n),
            }
        }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    let off = 2 * done;
    // SAFETY: `done <= n` elements were reduced; the remaining
    // `2 * (n - done)` bytes from `off` on are inside the caller's ranges,
    // with the same aliasing, and a whole number of elements.
    unsafe {
        dispatch_op::<[f16; F16_PER_UNIT]>(
            op,
            dst.wrapping_add(off),
            a.wrapping_add(off),
            b.wrapping_add(off),
            2 * (n - done),
        )
    }
}

/// The `Half` kernel for x86-64 CPUs with F16C: the hardware converts eight
/// elements at a time, with the same round to nearest even (and the same
/// results) as `half`, which uses the same instructions when it detects
/// them, one small slice at a time; doing it here, in one function compiled
/// for AVX, is several times faster.
#[cfg(target_arch = "x86_64")]
mod f16c {
    use super::{Op, ReduceOp};
    use core::arch::x86_64::{
        __m128i, __m256, _mm256_add_ps, _mm256_blendv_ps, _mm256_cmp_ps, _mm256_cvtph_ps,
        _mm256_cvtps_ph, _mm256_max_ps, _mm256_min_ps, _mm256_mul_ps, _mm256_setzero_ps,
        _mm_loadu_si128, _mm_storeu_si128, _CMP_UNORD_Q, _MM_FROUND_TO_NEAREST_INT,
    };

    /// Elements per block: four vectors of eight.
    const N: usize = 32;

    /// Whether this CPU can run [`kernel`] (std caches the answer).
    #[inline]
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
    }

    /// `O` on eight f32 lanes, with the module's semantics: `minps`/`maxps`
    /// give `a < b ? a : b` (resp. `>`), i.e. `b` when either is NaN, and
    /// the blend then takes `a` where `b` is NaN: IEEE minNum/maxNum, as
    /// `f32::min`/`max` (the spelled-out form also keeps LLVM from turning
    /// them into calls to `fminf`, which it does in AVX functions).
    #[target_feature(enable = "avx")]
    #[inline]
    fn apply<O: Op>(a: __m256, b: __m256) -> __m256 {
        match O::KIND {
            ReduceOp::Prod => _mm256_mul_ps(a, b),
            ReduceOp::Min => {
                _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b))
            }
            ReduceOp::Max => {
                _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b))
            }
            ReduceOp::Sum | ReduceOp::Avg => _mm256_add_ps(a, b),
        }
    }

    /// `dst[i] = op(a[i], b[i])` for the whole blocks of [`N`] among the `n`
    /// binary16 elements; returns how many elements it did (`n / N * N`).
    ///
    /// # Safety
    ///
    /// `a` and `b` valid for reads and `dst` valid for writes of `2 * n`
    /// bytes (any alignment); `dst` may equal `a` or `b` but must not
    /// partially overlap either; the CPU supports F16C and AVX.
    #[target_feature(enable = "avx,f16c")]
    #[inline(never)]
    pub(super) unsafe fn kernel<O: Op>(
        dst: *mut u8,
        a: *const u8,
        b: *const u8,
        n: usize,
    ) -> usize {
        let full = n / N;
        for i in 0..full {
            let off = i * 2 * N;
            let mut r = [_mm256_setzero_ps(); N / 8];
            for (k, r) in r.iter_mut().enumerate() {
                // SAFETY: bytes `[off + 16k, off + 16k + 16)` lie inside
                // block `i < n / N`, within the caller's `2 * n` readable
                // bytes of `a` and `b`; unaligned loads need no alignment.
                let (va, vb) = unsafe {
                    (
                        _mm_loadu_si128(a.add(off + 16 * k).cast::<__m128i>()),
                        _mm_loadu_si128(b.add(off + 16 * k).cast::<__m128i>()),
                    )
                };
                *r = apply::<O>(_mm256_cvtph_ps(va), _mm256_cvtph_ps(vb));
            }
            // Every load of the block happened above, before any store to
            // `dst`, so an exact alias of `dst` is harmless.
            for (k, r) in r.iter().enumerate() {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*r);
                // SAFETY: the same 16 bytes of `dst`, writable by the
                // caller's contract.
                unsafe { _mm_storeu_si128(dst.add(off + 16 * k).cast::<__m128i>(), h) };
            }
        }
        full * N
    }
}

/// `acc[i] = op(acc[i], src[i])` for each of the `n` elements of type `dt`
/// at the raw byte ranges `acc` and `src` (any alignment, native
/// little-endian layout). [`ReduceOp::Avg`] accumulates like
/// [`ReduceOp::Sum`]; the division happens once, in [`finish`].
///
/// The buffers are only ever accessed through raw pointer reads and
/// writes, never through references, so they may be memory that another
/// process or an RDMA peer can write; bytes that change while the call runs
/// may be seen old or new (the result is then meaningless). Each element of
/// `acc` is read once and then written once, a block at a time, in address
/// order; `acc` is never used as scratch space.
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
            DataType::Half => dispatch_half(op, dst, a, b, n),
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

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// xorshift64*: deterministic test data.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    /// A scalar model of one data type: random values, little-endian
    /// encoding, and the straightforward reference of each operator.
    trait Model: Copy + core::fmt::Debug {
        const DT: DataType;
        fn gen(r: &mut Rng) -> Self;
        fn get(b: &[u8]) -> Self;
        fn put(self, b: &mut [u8]);
        fn op(op: ReduceOp, a: Self, b: Self) -> Self;
        fn avg(sum: Self, n: usize) -> Self;
        /// Do two results agree? Exact, except that any NaN matches any
        /// NaN and, for Min/Max, +0 matches -0.
        fn same(op: ReduceOp, x: Self, y: Self) -> bool;
    }

    macro_rules! model_int {
        ($($t:ty => $dt:ident),*) => {$(
            impl Model for $t {
                const DT: DataType = DataType::$dt;
                fn gen(r: &mut Rng) -> Self {
                    r.next() as $t
                }
                fn get(b: &[u8]) -> Self {
                    <$t>::from_le_bytes(b.try_into().unwrap())
                }
                fn put(self, b: &mut [u8]) {
                    b.copy_from_slice(&self.to_le_bytes());
                }
                fn op(op: ReduceOp, a: Self, b: Self) -> Self {
                    match op {
                        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                        ReduceOp::Prod => a.wrapping_mul(b),
                        ReduceOp::Min => if a < b { a } else { b },
                        ReduceOp::Max => if a > b { a } else { b },
                    }
                }
                fn avg(sum: Self, n: usize) -> Self {
                    (i128::from(sum) / n as i128) as $t
                }
                fn same(_: ReduceOp, x: Self, y: Self) -> bool {
                    x == y
                }
            }
        )*};
    }
    model_int!(i8 => Int8, u8 => Uint8, i32 => Int32, u32 => Uint32, i64 => Int64, u64 => Uint64);

    /// Reference Min/Max: IEEE minNum/maxNum, spelled out.
    fn min_num(a: f64, b: f64, min: bool) -> f64 {
        if a.is_nan() {
            b
        } else if b.is_nan() || (a < b) == min {
            a
        } else {
            b
        }
    }

    macro_rules! model_float {
        ($($t:ty => $dt:ident, $bits:ty, $wide:ty, $to:expr, $from:expr;)*) => {$(
            impl Model for $t {
                const DT: DataType = DataType::$dt;
                fn gen(r: &mut Rng) -> Self {
                    let from: fn($wide) -> $t = $from;
                    let v = r.next();
                    match v % 8 {
                        // Any bit pattern: NaNs, infinities, subnormals...
                        0 | 1 => <$t>::from_bits(v as $bits),
                        2 => from([0.0, -0.0, 1.0, -1.0, 0.5, 3.0][(v >> 8) as usize % 6]),
                        // Moderate values, with sums and products that round.
                        _ => from((((v >> 16) % 20001) as $wide - 10000.0) / 1237.0),
                    }
                }
                fn get(b: &[u8]) -> Self {
                    <$t>::from_bits(<$bits>::from_le_bytes(b.try_into().unwrap()))
                }
                fn put(self, b: &mut [u8]) {
                    b.copy_from_slice(&self.to_bits().to_le_bytes());
                }
                fn op(op: ReduceOp, a: Self, b: Self) -> Self {
                    let to: fn($t) -> $wide = $to;
                    let from: fn($wide) -> $t = $from;
                    let (a, b) = (to(a), to(b));
                    from(match op {
                        ReduceOp::Sum | ReduceOp::Avg => a + b,
                        ReduceOp::Prod => a * b,
                        ReduceOp::Min => min_num(a as f64, b as f64, true) as $wide,
                        ReduceOp::Max => min_num(a as f64, b as f64, false) as $wide,
                    })
                }
                fn avg(sum: Self, n: usize) -> Self {
                    let to: fn($t) -> $wide = $to;
                    let from: fn($wide) -> $t = $from;
                    from(to(sum) / n as $wide)
                }
                fn same(op: ReduceOp, x: Self, y: Self) -> bool {
                    let to: fn($t) -> $wide = $to;
                    let (fx, fy) = (to(x), to(y));
                    x.to_bits() == y.to_bits()
                        || (fx.is_nan() && fy.is_nan())
                        || (matches!(op, ReduceOp::Min | ReduceOp::Max) && fx == 0.0 && fy == 0.0)
                }
            }
        )*};
    }
    model_float! {
        f32 => Float, u32, f32, |v| v, |v| v;
        f64 => Double, u64, f64, |v| v, |v| v;
        f16 => Half, u16, f32, |v| v.to_f32(), f16::from_f32;
        bf16 => Bfloat16, u16, f32, |v| v.to_f32(), bf16::from_f32;
    }

    const LENS: [usize; 12] = [0, 1, 2, 31, 32, 33, 63, 64, 65, 127, 129, 1000];
    const GUARD: usize = 16;
    const FILL: u8 = 0xA5;

    /// A byte buffer holding `n` elements of `M` starting at byte `off`,
    /// with guard bytes around them.
    struct Buf {
        bytes: Vec<u8>,
        off: usize,
        len: usize,
    }

    impl Buf {
        fn new<M: Model>(vals: &[M], off: usize) -> Buf {
            let size = M::DT.size();
            let len = vals.len() * size;
            let mut bytes = vec![FILL; off + len + GUARD];
            for (i, v) in vals.iter().enumerate() {
                v.put(&mut bytes[off + i * size..off + (i + 1) * size]);
            }
            Buf { bytes, off, len }
        }
        fn ptr(&mut self) -> *mut u8 {
            self.bytes[self.off..].as_mut_ptr()
        }
        fn vals<M: Model>(&self) -> Vec<M> {
            let size = M::DT.size();
            assert!(
                self.bytes[..self.off].iter().all(|&b| b == FILL),
                "wrote before"
            );
            assert!(
                self.bytes[self.off + self.len..].iter().all(|&b| b == FILL),
                "wrote after"
            );
            self.bytes[self.off..self.off + self.len]
                .chunks(size)
                .map(M::get)
                .collect()
        }
    }

    fn gen<M: Model>(r: &mut Rng, n: usize) -> Vec<M> {
        (0..n).map(|_| M::gen(r)).collect()
    }

    fn assert_same<M: Model>(op: ReduceOp, got: &[M], want: &[M], what: &str) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                M::same(op, *g, *w),
                "{what}: {} {} element {i} of {}: got {g:?}, want {w:?}",
                M::DT.name(),
                op.name(),
                got.len()
            );
        }
    }

    /// A `reduce3` over `n` elements of one data type, with its contract.
    type Reduce3 = unsafe fn(ReduceOp, *mut u8, *const u8, *const u8, usize);

    /// The public `reduce3` for `M`.
    ///
    /// # Safety
    ///
    /// As [`reduce3`] for `M::DT`.
    unsafe fn public<M: Model>(op: ReduceOp, d: *mut u8, a: *const u8, b: *const u8, n: usize) {
        // SAFETY: the caller upholds `reduce3`'s contract.
        unsafe { reduce3(M::DT, op, d, a, b, n) }
    }

    /// The portable `Half` kernel (`half`'s slice conversions), which the
    /// public path only uses for tails on a CPU with F16C.
    ///
    /// # Safety
    ///
    /// As [`reduce3`] for `DataType::Half`.
    unsafe fn portable_half(op: ReduceOp, d: *mut u8, a: *const u8, b: *const u8, n: usize) {
        // SAFETY: `2 * n` bytes are the caller's `n` binary16 elements.
        unsafe { dispatch_op::<[f16; F16_PER_UNIT]>(op, d, a, b, 2 * n) }
    }

    /// Every operator and length at unaligned offsets, out of place
    /// (separate, dst == a, dst == b) and, through the public API, in place
    /// (`reduce_into`, also with src == acc), against the scalar model.
    fn check_kernels<M: Model>(r3: Reduce3, public_api: bool) {
        let mut r = Rng(0x9E37_79B9_7F4A_7C15 ^ M::DT.size() as u64);
        for op in ReduceOp::ALL {
            for n in LENS {
                for (oa, ob, od) in [(1, 3, 2), (3, 1, 5), (0, 0, 0)] {
                    let a = gen::<M>(&mut r, n);
                    let b = gen::<M>(&mut r, n);
                    let want: Vec<M> = a.iter().zip(&b).map(|(x, y)| M::op(op, *x, *y)).collect();

                    if public_api {
                        let mut acc = Buf::new(&a, oa);
                        let mut src = Buf::new(&b, ob);
                        // SAFETY: both buffers hold `n` elements of `M::DT`
                        // at their pointers and do not overlap.
                        unsafe { reduce_into(M::DT, op, acc.ptr(), src.ptr(), n) };
                        assert_same(op, &acc.vals::<M>(), &want, "reduce_into");
                        assert_same(op, &src.vals::<M>(), &b, "reduce_into src");

                        let twice: Vec<M> = a.iter().map(|x| M::op(op, *x, *x)).collect();
                        let mut acc = Buf::new(&a, oa);
                        let p = acc.ptr();
                        // SAFETY: src == acc exactly, `n` elements.
                        unsafe { reduce_into(M::DT, op, p, p, n) };
                        assert_same(op, &acc.vals::<M>(), &twice, "reduce_into src == acc");
                    }

                    let mut pa = Buf::new(&a, oa);
                    let mut pb = Buf::new(&b, ob);
                    let mut dst = Buf::new(&vec![M::gen(&mut r); n], od);
                    // SAFETY: three disjoint buffers of `n` elements.
                    unsafe { r3(op, dst.ptr(), pa.ptr(), pb.ptr(), n) };
                    assert_same(op, &dst.vals::<M>(), &want, "reduce3");
                    assert_same(op, &pa.vals::<M>(), &a, "reduce3 input a");
                    assert_same(op, &pb.vals::<M>(), &b, "reduce3 input b");

                    // SAFETY: dst == a exactly, b disjoint; `n` elements each.
                    unsafe { r3(op, pa.ptr(), pa.ptr(), pb.ptr(), n) };
                    assert_same(op, &pa.vals::<M>(), &want, "reduce3 dst == a");

                    let mut pa = Buf::new(&a, oa);
                    // SAFETY: dst == b exactly, a disjoint; `n` elements each.
                    unsafe { r3(op, pb.ptr(), pa.ptr(), pb.ptr(), n) };
                    assert_same(op, &pb.vals::<M>(), &want, "reduce3 dst == b");
                }
            }
        }
    }

    #[test]
    fn portable_half_kernel_matches_reference() {
        check_kernels::<f16>(portable_half, false);
    }

    /// Avg over several ranks: accumulate with `reduce_into`, then `finish`.
    fn check_avg<M: Model>() {
        let mut r = Rng(0xD1B5_4A32_D192_ED03 ^ M::DT.size() as u64);
        for nranks in [1, 2, 3, 7, 300] {
            for n in [1, 65, 1000] {
                let inputs: Vec<Vec<M>> = (0..nranks).map(|_| gen::<M>(&mut r, n)).collect();
                let mut want = inputs[0].clone();
                for input in &inputs[1..] {
                    for (w, x) in want.iter_mut().zip(input) {
                        *w = M::op(ReduceOp::Sum, *w, *x);
                    }
                }
                let want: Vec<M> = want.iter().map(|&s| M::avg(s, nranks)).collect();

                let mut acc = Buf::new(&inputs[0], 3);
                for input in &inputs[1..] {
                    let mut src = Buf::new(input, 1);
                    // SAFETY: disjoint buffers of `n` elements.
                    unsafe { reduce_into(M::DT, ReduceOp::Avg, acc.ptr(), src.ptr(), n) };
                }
                // SAFETY: `acc` holds `n` elements.
                unsafe { finish(M::DT, ReduceOp::Avg, acc.ptr(), n, nranks) };
                assert_same(ReduceOp::Avg, &acc.vals::<M>(), &want, "avg");

                // Every other operator's finish leaves the bytes alone.
                for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                    let before = acc.bytes.clone();
                    // SAFETY: `acc` holds `n` elements.
                    unsafe { finish(M::DT, op, acc.ptr(), n, nranks) };
                    assert_eq!(acc.bytes, before, "{} finish changed the buffer", op.name());
                }
            }
        }
    }

    macro_rules! per_type {
        ($($name:ident: $t:ty,)*) => {$(
            mod $name {
                #[test]
                fn kernels_match_reference() {
                    super::check_kernels::<$t>(super::public::<$t>, true);
                }
                #[test]
                fn avg_matches_reference() {
                    super::check_avg::<$t>();
                }
            }
        )*};
    }
    per_type! {
        dt_int8: i8,
        dt_uint8: u8,
        dt_int32: i32,
        dt_uint32: u32,
        dt_int64: i64,
        dt_uint64: u64,
        dt_half: super::f16,
        dt_float: f32,
        dt_double: f64,
        dt_bfloat16: super::bf16,
    }

    /// Runs `reduce_into` on two single-type slices and returns `acc`.
    fn run<M: Model>(op: ReduceOp, a: &[M], b: &[M]) -> Vec<M> {
        let mut acc = Buf::new(a, 1);
        let mut src = Buf::new(b, 3);
        // SAFETY: disjoint buffers of `a.len() == b.len()` elements.
        unsafe { reduce_into(M::DT, op, acc.ptr(), src.ptr(), a.len()) };
        acc.vals()
    }

    fn run_avg<M: Model>(inputs: &[M]) -> M {
        let mut acc = Buf::new(&inputs[..1], 1);
        for x in &inputs[1..] {
            let mut src = Buf::new(core::slice::from_ref(x), 2);
            // SAFETY: disjoint one-element buffers.
            unsafe { reduce_into(M::DT, ReduceOp::Avg, acc.ptr(), src.ptr(), 1) };
        }
        // SAFETY: one element.
        unsafe { finish(M::DT, ReduceOp::Avg, acc.ptr(), 1, inputs.len()) };
        acc.vals()[0]
    }

    #[test]
    fn integers_wrap() {
        assert_eq!(run(ReduceOp::Sum, &[i32::MAX], &[1]), [i32::MIN]);
        assert_eq!(run(ReduceOp::Sum, &[u64::MAX], &[2u64]), [1]);
        assert_eq!(run(ReduceOp::Prod, &[200u8], &[2]), [144]);
        assert_eq!(run(ReduceOp::Prod, &[i8::MIN], &[-1]), [i8::MIN]);
        assert_eq!(run(ReduceOp::Prod, &[1i64 << 62], &[4]), [0]);
        assert_eq!(run(ReduceOp::Min, &[-1i8, 5], &[3, -7]), [-1, -7]);
        assert_eq!(run(ReduceOp::Max, &[u32::MAX, 0], &[1, 0]), [u32::MAX, 0]);
    }

    #[test]
    fn avg_truncates_towards_zero() {
        assert_eq!(run_avg(&[-3i8, -4]), -3);
        assert_eq!(run_avg(&[3i8, 4]), 3);
        assert_eq!(run_avg(&[-128i8, -1, -1]), 42); // wraps to 126 first
        assert_eq!(run_avg(&[250u8, 10]), 2); // wraps to 4 first
        assert_eq!(run_avg(&[-7i32, 0]), -3);
        assert_eq!(run_avg(&[i32::MIN, -1]), i32::MAX / 2); // wraps to i32::MAX
        assert_eq!(run_avg(&[u32::MAX, 0, 0]), u32::MAX / 3);
        assert_eq!(run_avg(&[-7i64, 0]), -3);
        assert_eq!(run_avg(&[i64::MIN, 0]), i64::MIN / 2);
        assert_eq!(run_avg(&[u64::MAX, 0]), u64::MAX / 2);
        assert_eq!(run_avg(&[1.0f32, 2.0, 4.0]), 7.0 / 3.0);
        assert_eq!(run_avg(&[1.0f64, 2.0, 4.0]), 7.0 / 3.0);
        let h = |v: f32| f16::from_f32(v);
        assert_eq!(run_avg(&[h(1.0), h(2.0), h(4.0)]), h(7.0 / 3.0));
        let b = |v: f32| bf16::from_f32(v);
        assert_eq!(run_avg(&[b(-1.0), b(-2.0)]), b(-1.5));
    }

    #[test]
    fn avg_of_large_u32_is_exact() {
        // Quotients just below an integer must not round up to it.
        for (v, n) in [
            (u32::MAX, 2usize),
            (u32::MAX - 1, 3),
            (u32::MAX, 65537),
            (7, 8),
        ] {
            let mut buf = v.to_le_bytes();
            // SAFETY: one u32.
            unsafe { finish(DataType::Uint32, ReduceOp::Avg, buf.as_mut_ptr(), 1, n) };
            assert_eq!(u32::from_le_bytes(buf), v / n as u32);
        }
        let mut buf = i64::MIN.to_le_bytes();
        // SAFETY: one i64.
        unsafe { finish(DataType::Int64, ReduceOp::Avg, buf.as_mut_ptr(), 1, 1 << 63) };
        assert_eq!(i64::from_le_bytes(buf), -1);
    }

    #[test]
    fn avg_of_every_8_bit_value_is_exact() {
        let big = [1 << 24, (1 << 24) + 1, u32::MAX as usize, usize::MAX];
        for n in (1..=520).chain(big) {
            let mut signed: Vec<u8> = (0..=255u8).collect();
            let mut unsigned = signed.clone();
            // SAFETY: 256 one-byte elements each.
            unsafe {
                finish(DataType::Int8, ReduceOp::Avg, signed.as_mut_ptr(), 256, n);
                finish(
                    DataType::Uint8,
                    ReduceOp::Avg,
                    unsigned.as_mut_ptr(),
                    256,
                    n,
                );
            }
            for v in 0..=255u8 {
                let want = (i128::from(v as i8) / n as i128) as i8;
                assert_eq!(signed[usize::from(v)] as i8, want, "{} / {n}", v as i8);
                let want = (u128::from(v) / n as u128) as u8;
                assert_eq!(unsigned[usize::from(v)], want, "{v} / {n}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "0 ranks")]
    fn avg_over_zero_ranks_panics() {
        let mut buf = [0u8; 4];
        // SAFETY: one f32.
        unsafe { finish(DataType::Float, ReduceOp::Avg, buf.as_mut_ptr(), 1, 0) };
    }

    #[test]
    fn sixteen_bit_floats_round_to_nearest_even() {
        let h = |v: f32| f16::from_f32(v);
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even is 1.
        assert_eq!(
            run(ReduceOp::Sum, &[h(1.0)], &[h(2f32.powi(-11))]),
            [h(1.0)]
        );
        // (1 + 2^-10) + 2^-11: tie, even is 1 + 2^-9 (upwards).
        let odd = 1.0 + 2f32.powi(-10);
        let got = run(ReduceOp::Sum, &[h(odd)], &[h(2f32.powi(-11))]);
        assert_eq!(got[0].to_f32(), 1.0 + 2f32.powi(-9));
        // Overflow rounds to infinity; subnormal results are kept.
        assert_eq!(run(ReduceOp::Sum, &[f16::MAX], &[h(16.0)]), [f16::INFINITY]);
        let tiny = f16::from_bits(1);
        assert_eq!(run(ReduceOp::Sum, &[tiny], &[tiny]), [f16::from_bits(2)]);

        let b = |v: f32| bf16::from_f32(v);
        assert_eq!(run(ReduceOp::Sum, &[b(1.0)], &[b(2f32.powi(-8))]), [b(1.0)]);
        let odd = 1.0 + 2f32.powi(-7);
        let got = run(ReduceOp::Sum, &[b(odd)], &[b(2f32.powi(-8))]);
        assert_eq!(got[0].to_f32(), 1.0 + 2f32.powi(-6));
        assert_eq!(
            run(ReduceOp::Sum, &[bf16::MAX], &[bf16::MAX]),
            [bf16::INFINITY]
        );
        let tiny = bf16::from_bits(1);
        assert_eq!(run(ReduceOp::Sum, &[tiny], &[tiny]), [bf16::from_bits(2)]);
        // bf16 products round too (3 * 3 * ... exceeds 8 mantissa bits).
        assert_eq!(run(ReduceOp::Prod, &[b(257.0)], &[b(3.0)]), [b(768.0)]);
    }

    #[test]
    fn float_min_max_ignore_a_single_nan() {
        fn check<M: Model + PartialEq>(nan: M, one: M, two: M, is_nan: fn(M) -> bool) {
            for (op, want) in [(ReduceOp::Min, one), (ReduceOp::Max, two)] {
                let got = run(op, &[nan, one, two, nan], &[one, nan, one, nan]);
                assert_eq!(got[0], one, "{} {}", M::DT.name(), op.name());
                assert_eq!(got[1], one, "{} {}", M::DT.name(), op.name());
                assert_eq!(got[2], want, "{} {}", M::DT.name(), op.name());
                assert!(is_nan(got[3]), "{} {}", M::DT.name(), op.name());
            }
            // Arithmetic propagates NaN.
            for op in [ReduceOp::Sum, ReduceOp::Prod] {
                assert!(is_nan(run(op, &[nan], &[one])[0]));
                assert!(is_nan(run(op, &[one], &[nan])[0]));
            }
        }
        check(f32::NAN, 1.0f32, 2.0, f32::is_nan);
        check(f64::NAN, 1.0f64, 2.0, f64::is_nan);
        check(f16::NAN, f16::ONE, f16::from_f32(2.0), f16::is_nan);
        check(bf16::NAN, bf16::ONE, bf16::from_f32(2.0), bf16::is_nan);
        // Signalling NaNs (quiet bit clear) behave the same.
        let snan16 = f16::from_bits(0x7C01);
        check(snan16, f16::ONE, f16::from_f32(2.0), f16::is_nan);
        let snanb = bf16::from_bits(0x7F81);
        check(snanb, bf16::ONE, bf16::from_f32(2.0), bf16::is_nan);
    }

    #[test]
    fn bf16_conversion_matches_half() {
        // Every sign/exponent/top-mantissa pattern (the 16 bits kept), with
        // the dropped bits at and around the rounding boundary, plus a
        // pseudo-random sweep.
        let mut r = Rng(42);
        for hi in 0..=u32::from(u16::MAX) {
            let low = [
                0,
                1,
                0x7FFF,
                0x8000,
                0x8001,
                0xFFFF,
                r.next() as u32 & 0xFFFF,
            ];
            for lo in low {
                let f = f32::from_bits(hi << 16 | lo);
                let got = f32_to_bf16(f);
                assert!(got <= 0xFFFF);
                let want = bf16::from_f32(f);
                if want.is_nan() {
                    assert!(bf16::from_bits(got as u16).is_nan(), "{f:?}");
                } else {
                    assert_eq!(got as u16, want.to_bits(), "{f:?}");
                }
            }
        }
    }

    #[test]
    fn names_round_trip() {
        let names = [
            "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
            "bfloat16",
        ];
        let sizes = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2];
        for ((dt, name), size) in DataType::ALL.into_iter().zip(names).zip(sizes) {
            assert_eq!(dt.name(), name);
            assert_eq!(dt.size(), size);
            assert_eq!(DataType::parse(name), Some(dt));
        }
        for (alias, dt) in [
            ("char", DataType::Int8),
            ("int", DataType::Int32),
            ("float16", DataType::Half),
            ("fp16", DataType::Half),
            ("float32", DataType::Float),
            ("fp32", DataType::Float),
            ("float64", DataType::Double),
            ("fp64", DataType::Double),
            ("bf16", DataType::Bfloat16),
        ] {
            assert_eq!(DataType::parse(alias), Some(dt), "{alias}");
        }
        for bad in ["", "all", "Float", "int16", "f32", " float"] {
            assert_eq!(DataType::parse(bad), None, "{bad:?}");
        }

        let names = ["sum", "prod", "min", "max", "avg"];
        for (op, name) in ReduceOp::ALL.into_iter().zip(names) {
            assert_eq!(op.name(), name);
            assert_eq!(ReduceOp::parse(name), Some(op));
        }
        for bad in ["", "all", "Sum", "mean", "premulsum"] {
            assert_eq!(ReduceOp::parse(bad), None, "{bad:?}");
        }
    }
}
