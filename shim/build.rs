//! The cdylib names itself `libsoftroce.so` (DT_SONAME), so that the replacement
//! `libibverbs.so.1` and `librdmacm.so.1`, which only *need* `libsoftroce.so`, bind to a
//! `libsoftroce.so` that is already loaded (LD_PRELOAD, or the other replacement) instead of
//! loading a second copy of the shim and its state: ld.so matches a DT_NEEDED name against the
//! SONAMEs of the objects it has loaded, whatever their path or scope.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsoftroce.so");
}
