//! AFL++ target `vhost_user`: see the harness in `vrdma_fuzz::run` and `mk/fuzz.mk`.

fn main() {
    vrdma_fuzz::record_panics();
    afl::fuzz!(|data: &[u8]| {
        vrdma_fuzz::run("vhost_user", data);
    });
}
