//! With no daemon at `$SOFTROCE_SOCKET`, the device list is empty (not NULL) and nothing can be
//! opened: there is no built-in fallback device. (The stderr line is checked end to end in
//! tests/tests/shim_devices.rs.)

use softroce::verbs::context::*;

#[test]
fn no_daemon_means_an_empty_non_null_list() {
    let dir = std::env::temp_dir().join(format!("softroce-no-daemon-{}", std::process::id()));
    std::env::set_var("SOFTROCE_SOCKET", dir.join("ctl.sock"));
    let mut n = -1;
    // SAFETY: `n` is writable; the list is freed right away.
    unsafe {
        let list = ibv_get_device_list(&mut n);
        assert!(!list.is_null());
        assert_eq!(n, 0);
        assert!(
            (*list).is_null(),
            "NULL-terminated, with nothing before the NULL"
        );
        ibv_free_device_list(list);
    }
    assert!(softroce::runtime::devices().is_empty());
}
