//! Test workload for kiln-agent's unwinder: a Rust release build (no frame
//! pointers) whose hot loop is three calls deep, main -> kiln_rs_outer ->
//! kiln_rs_middle -> kiln_rs_inner. Each caller uses its callee's result
//! after the call, so no call becomes a tail jump; `#[no_mangle]` keeps the
//! names plain. Runs until killed.

use std::hint::black_box;

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn kiln_rs_inner(seed: u64) -> u64 {
    let mut x = seed;
    for i in 0..2_000_000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        x ^= x >> 29;
    }
    x
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn kiln_rs_middle(seed: u64) -> u64 {
    let a = kiln_rs_inner(black_box(seed));
    black_box(a).rotate_left(7) ^ seed
}

#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn kiln_rs_outer(seed: u64) -> u64 {
    let a = kiln_rs_middle(black_box(seed));
    black_box(a).wrapping_add(seed)
}

fn main() {
    let mut seed = 1u64;
    loop {
        seed = black_box(kiln_rs_outer(black_box(seed)));
    }
}
