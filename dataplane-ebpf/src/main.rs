#![no_std]
#![no_main]

use aya_ebpf::{bindings::TC_ACT_PIPE, macros::classifier, programs::TcContext};

#[classifier]
pub fn flowmon(_ctx: TcContext) -> i32 {
    TC_ACT_PIPE
}

#[classifier]
pub fn noop(_ctx: TcContext) -> i32 {
    TC_ACT_PIPE
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
