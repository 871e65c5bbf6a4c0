//! One shim state per process, whichever of `libsoftroce.so`, the replacement
//! `libibverbs.so.1` and the replacement `librdmacm.so.1` the loader meets first and however:
//! pyverbs (whose extensions are loaded RTLD_LOCAL, each needing libibverbs and librdmacm)
//! through LD_LIBRARY_PATH, through LD_PRELOAD and through both at once; and a C program that
//! dlopens the two replacements RTLD_LOCAL and mixes their handles on one object.

mod shim_support;

use std::process::Command;

use shim_support::{check_output, compile_c, require_program, shim_libs, Daemon};

/// Opens the device with pyverbs and makes a PD, a CQ and an MR on it: each verb on an object
/// made by another (a PD on the context, a CQ on the context, an MR on the PD), so two copies of
/// the shim would fail at `PD()` with EINVAL. Prints how many copies of libsoftroce.so are
/// mapped.
const PYVERBS: &str = r#"
import pyverbs.device as d
from pyverbs.pd import PD
from pyverbs.cq import CQ
from pyverbs.mr import MR
import pyverbs.enums as e
from pyverbs.cmid import AddrInfo
names = [dev.name.decode() for dev in d.get_device_list()]
ctx = d.Context(name=names[0])
pd = PD(ctx)
cq = CQ(ctx, 16)
mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
ai = AddrInfo(src='127.0.0.1', src_service='7999', port_space=0x0106, flags=1)
print("devices", names, "lkey", mr.lkey != 0)
copies = {l.split()[-1] for l in open('/proc/self/maps') if 'libsoftroce' in l}
print("copies", len(copies))
"#;

fn pyverbs(how: &str, vars: &[(&str, &std::ffi::OsStr)], daemon: &Daemon) {
    let python = require_program("python3"); // /usr/bin/python3: the one pyverbs is built for
    let mut cmd = Command::new(python);
    cmd.args(["-c", PYVERBS])
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .env("SOFTROCE_SOCKET", &daemon.socket);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = check_output(
        &format!("pyverbs through {how}"),
        cmd.output().expect("python3"),
    );
    assert!(
        out.contains("devices ['srxe0'] lkey True\n"),
        "{how}:\n{out}"
    );
    assert!(out.contains("copies 1\n"), "{how}: not one shim:\n{out}");
}

#[test]
fn pyverbs_finds_one_shim_state_however_it_is_loaded() {
    let libs = shim_libs();
    let daemon = Daemon::start("one-state-pyverbs", &[]);
    let dir = libs.replacement_dir.as_os_str();
    let preload = libs.preload.as_os_str();
    pyverbs("LD_LIBRARY_PATH", &[("LD_LIBRARY_PATH", dir)], &daemon);
    pyverbs("LD_PRELOAD", &[("LD_PRELOAD", preload)], &daemon);
    pyverbs(
        "LD_PRELOAD and LD_LIBRARY_PATH",
        &[("LD_PRELOAD", preload), ("LD_LIBRARY_PATH", dir)],
        &daemon,
    );
}

/// librdmacm first (RTLD_LOCAL), then libibverbs (RTLD_LOCAL): the context comes from one
/// handle, the PD from the other, and rdma_cm's shared context of the device is the same
/// object the verbs handle opens. Prints one line per check.
const DLOPEN_BOTH: &str = r#"
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <dlfcn.h>
#include <stdio.h>

#define SYM(h, name) ((__typeof__(&name))dlsym(h, #name))

int main(void)
{
    void *cm = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_LOCAL);
    void *vb = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cm || !vb) { printf("FAIL dlopen %s\n", dlerror()); return 1; }
    int n = 0;
    struct ibv_device **list = SYM(cm, ibv_get_device_list)(&n);
    if (!list || n != 1) { printf("FAIL list %d\n", n); return 1; }
    struct ibv_context *ctx = SYM(cm, ibv_open_device)(list[0]);
    struct ibv_pd *pd = SYM(vb, ibv_alloc_pd)(ctx);
    printf("pd %s\n", pd ? "ok" : "FAIL");
    struct ibv_cq *cq = SYM(vb, ibv_create_cq)(ctx, 8, NULL, NULL, 0);
    printf("cq %s\n", cq ? "ok" : "FAIL");
    struct rdma_event_channel *ch = SYM(cm, rdma_create_event_channel)();
    struct rdma_cm_id *id = NULL;
    int rc = SYM(cm, rdma_create_id)(ch, &id, NULL, RDMA_PS_TCP);
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
    rc = rc ? rc : SYM(vb, rdma_bind_addr)(id, (struct sockaddr *)&sin);
    printf("bind %d\n", rc);
    if (rc == 0 && id->verbs) {
        struct ibv_pd *pd2 = SYM(vb, ibv_alloc_pd)(id->verbs);
        printf("cm-context pd %s\n", pd2 ? "ok" : "FAIL");
        SYM(cm, ibv_dealloc_pd)(pd2);
    }
    SYM(cm, rdma_destroy_id)(id);
    SYM(vb, rdma_destroy_event_channel)(ch);
    printf("destroy %d %d\n", SYM(cm, ibv_destroy_cq)(cq), SYM(cm, ibv_dealloc_pd)(pd));
    printf("close %d\n", SYM(vb, ibv_close_device)(ctx));
    SYM(vb, ibv_free_device_list)(list);
    return 0;
}
"#;

#[test]
fn dlopen_rtld_local_of_both_replacements_shares_one_state() {
    let libs = shim_libs();
    let daemon = Daemon::start("one-state-dlopen", &[]);
    let exe = compile_c("shim_dlopen_both", DLOPEN_BOTH, &["dl"]);
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &libs.replacement_dir)
        .env("SOFTROCE_SOCKET", &daemon.socket)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run shim_dlopen_both");
    let stdout = check_output("shim_dlopen_both", out);
    for line in [
        "pd ok",
        "cq ok",
        "bind 0",
        "cm-context pd ok",
        "destroy 0 0",
        "close 0",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing {line:?}:\n{stdout}"
        );
    }
}
