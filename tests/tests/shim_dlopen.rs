//! Programs that `dlopen("libibverbs.so.1")` + `dlsym(handle, ...)` bypass LD_PRELOAD
//! (verbs-abi.md §3.4); with the replacement libibverbs.so.1 on LD_LIBRARY_PATH they, and
//! normally linked programs, reach the shim (the `libsoftroce.so` the replacement needs)
//! without any preload.
//!
//! Known limit: `dlvsym(handle, name, "IBVERBS_1.1")` does not find the replacement's symbols,
//! because glibc's dlvsym insists on an exact version match and the symbols are unversioned.

mod shim_support;

use std::process::Command;

use shim_support::{check_output, compile_c, require_program, shim_libs, Daemon};

const PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("FAIL dlopen: %s\n", dlerror()); return 1; }
    struct ibv_device **(*get_list)(int *) = (struct ibv_device **(*)(int *))dlsym(h, "ibv_get_device_list");
    void (*free_list)(struct ibv_device **) = (void (*)(struct ibv_device **))dlsym(h, "ibv_free_device_list");
    struct ibv_context *(*open_dev)(struct ibv_device *) = (struct ibv_context *(*)(struct ibv_device *))dlsym(h, "ibv_open_device");
    int (*query_port)(struct ibv_context *, uint8_t, void *) = (int (*)(struct ibv_context *, uint8_t, void *))dlsym(h, "ibv_query_port");
    int (*close_dev)(struct ibv_context *) = (int (*)(struct ibv_context *))dlsym(h, "ibv_close_device");
    if (!get_list || !free_list || !open_dev || !query_port || !close_dev) {
        printf("FAIL dlsym\n");
        return 1;
    }
    Dl_info info;
    if (!dladdr((void *)get_list, &info)) { printf("FAIL dladdr\n"); return 1; }
    printf("resolved-from %s\n", info.dli_fname);
    int n = -1;
    struct ibv_device **list = get_list(&n);
    if (!list || n != 1) { printf("FAIL device list n=%d\n", n); return 1; }
    printf("device %s\n", list[0]->name);
    struct ibv_context *ctx = open_dev(list[0]);
    free_list(list);
    if (!ctx) { printf("FAIL open\n"); return 1; }
    unsigned char attr[48];
    int rc = query_port(ctx, 1, attr);
    printf("query_port %d state %u link_layer %u\n", rc, (unsigned)((struct ibv_port_attr *)attr)->state, attr[46]);
    printf("close %d\n", close_dev(ctx));
    return 0;
}
"#;

#[test]
fn dlopen_user_reaches_replacement_library() {
    let libs = shim_libs();
    let daemon = Daemon::start("dlopen", &[]);
    let exe = compile_c("shim_dlopen", PROGRAM, &["dl"]);
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &libs.replacement_dir)
        .env("SOFTROCE_SOCKET", &daemon.socket)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run shim_dlopen");
    let stdout = check_output("shim_dlopen with LD_LIBRARY_PATH=replacement", out);
    let from = stdout
        .lines()
        .find_map(|l| l.strip_prefix("resolved-from "))
        .unwrap_or_default();
    // The replacement has no code of its own: dlsym on its handle finds the symbol in its
    // dependency, the libsoftroce.so beside replacement/.
    assert!(
        from.starts_with(libs.replacement_dir.to_str().unwrap())
            && from.ends_with("/libsoftroce.so"),
        "ibv_get_device_list came from {from:?}, not the shim behind the replacement:\n{stdout}"
    );
    assert!(stdout.contains("device srxe0\n"), "{stdout}");
    assert!(
        stdout.contains("query_port 0 state 4 link_layer 2\n"),
        "{stdout}"
    );
    assert!(stdout.contains("close 0\n"), "{stdout}");
}

#[test]
fn linked_program_uses_replacement_without_preload() {
    let libs = shim_libs();
    let daemon = Daemon::start("dlopen-linked", &[]);
    let out = Command::new(require_program("ibv_devinfo"))
        .env("LD_LIBRARY_PATH", &libs.replacement_dir)
        .env("SOFTROCE_SOCKET", &daemon.socket)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run ibv_devinfo");
    let stdout = check_output("ibv_devinfo with LD_LIBRARY_PATH=replacement", out);
    assert!(stdout.contains("hca_id:\tsrxe0"), "{stdout}");
    assert!(stdout.contains("PORT_ACTIVE (4)"), "{stdout}");
}
