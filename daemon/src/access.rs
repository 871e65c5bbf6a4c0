//! Who may use the daemon and how many control connections it keeps.
//!
//! The daemon reaches every client's registered memory and often runs as root, so its control
//! socket is as closed as `/dev/infiniband/uverbs*` is by default: mode 0600, owned by the
//! daemon's user. Other users are let in deliberately, by uid (`--allow-uid`, then the socket
//! is 0666 and the daemon's own check decides) or by group (`--allow-group`, then the socket
//! is 0660 owned by the first such group, as udev rules hand `/dev/infiniband` to a group).
//! The file mode is only the first gate: every connection's credentials (`SO_PEERCRED`, and
//! `SO_PEERGROUPS` for supplementary groups) are checked by the daemon itself, a root daemon
//! included, so a socket made wider by hand (or reached through a passed descriptor) lets in
//! nobody the policy does not name.
//!
//! Each connection has a thread in the daemon; [`ConnectionSlots`] bounds them, over all users
//! and per user, so a client that opens connections in a loop gets EAGAIN instead of
//! exhausting the daemon's threads.

use crate::config::Config;
use anyhow::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The users and groups a daemon serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessPolicy {
    pub daemon_uid: u32,
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl AccessPolicy {
    /// The policy of `config` for a daemon running as `daemon_uid` (names resolved now).
    pub fn from_config(config: &Config, daemon_uid: u32) -> Result<AccessPolicy> {
        Ok(AccessPolicy {
            daemon_uid,
            uids: config
                .allow_uid
                .iter()
                .map(|u| u.uid())
                .collect::<Result<_>>()?,
            gids: config
                .allow_group
                .iter()
                .map(|g| g.gid())
                .collect::<Result<_>>()?,
        })
    }

    /// Whether a peer of `uid`, primary group `gid` and supplementary `groups` may connect;
    /// the error is the line the client is given.
    pub fn check(&self, uid: u32, gid: u32, groups: &[u32]) -> Result<(), String> {
        if uid == self.daemon_uid
            || self.uids.contains(&uid)
            || self.gids.contains(&gid)
            || groups.iter().any(|g| self.gids.contains(g))
        {
            return Ok(());
        }
        Err(format!(
            "uid {uid} may not use this daemon: it serves uid {} only (start it with \
             --allow-uid {uid} or --allow-group GROUP to let others in)",
            self.daemon_uid
        ))
    }

    /// The control socket's mode and group: 0600 for the daemon's user alone, 0660 with the
    /// first allowed group, 0666 when uids are allowed (the daemon checks each peer).
    pub fn socket_mode(&self) -> (u32, Option<u32>) {
        if !self.uids.is_empty() {
            (0o666, None)
        } else if let Some(&g) = self.gids.first() {
            (0o660, Some(g))
        } else {
            (0o600, None)
        }
    }
}

/// Counts open control connections against the caps (`max_connections`,
/// `max_connections_per_uid`).
#[derive(Debug, Clone)]
pub struct ConnectionSlots {
    inner: Arc<Mutex<SlotCounts>>,
    max_total: u32,
    max_per_uid: u32,
}

#[derive(Debug, Default)]
struct SlotCounts {
    total: u32,
    per_uid: HashMap<u32, u32>,
}

/// One connection's slot, given back when dropped (the connection's thread ends).
#[derive(Debug)]
pub struct ConnectionSlot {
    slots: Arc<Mutex<SlotCounts>>,
    uid: u32,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut c = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_uid.remove(&self.uid);
            }
        }
    }
}

impl ConnectionSlots {
    pub fn new(max_total: u32, max_per_uid: u32) -> ConnectionSlots {
        ConnectionSlots {
            inner: Arc::default(),
            max_total,
            max_per_uid,
        }
    }

    /// A slot for a connection of `uid`, or the line to refuse it with.
    pub fn take(&self, uid: u32) -> Result<ConnectionSlot, String> {
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if c.total >= self.max_total {
            return Err(format!(
                "the daemon holds {} control connections, its limit (max_connections)",
                c.total
            ));
        }
        let mine = c.per_uid.get(&uid).copied().unwrap_or(0);
        if mine >= self.max_per_uid {
            return Err(format!(
                "uid {uid} holds {mine} control connections, the limit per user \
                 (max_connections_per_uid)"
            ));
        }
        c.total += 1;
        *c.per_uid.entry(uid).or_insert(0) += 1;
        Ok(ConnectionSlot {
            slots: Arc::clone(&self.inner),
            uid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_daemons_user_unless_others_are_allowed() {
        let closed = AccessPolicy {
            daemon_uid: 0,
            uids: vec![],
            gids: vec![],
        };
        assert!(closed.check(0, 0, &[]).is_ok());
        // A root daemon no longer lets everyone in.
        let why = closed.check(65534, 65534, &[]).unwrap_err();
        assert!(why.contains("uid 65534 may not use this daemon"), "{why}");
        assert_eq!(closed.socket_mode(), (0o600, None));
        let group = AccessPolicy {
            gids: vec![44],
            ..closed.clone()
        };
        assert!(group.check(1000, 1000, &[27, 44]).is_ok());
        assert!(group.check(1000, 44, &[]).is_ok());
        assert!(group.check(1000, 1000, &[27]).is_err());
        assert_eq!(group.socket_mode(), (0o660, Some(44)));
        let uid = AccessPolicy {
            uids: vec![1000],
            ..group
        };
        assert!(uid.check(1000, 1, &[]).is_ok());
        assert_eq!(uid.socket_mode(), (0o666, None));
    }

    #[test]
    fn connection_slots_are_bounded_and_given_back() {
        let slots = ConnectionSlots::new(3, 2);
        let a = slots.take(1).unwrap();
        let _b = slots.take(1).unwrap();
        assert!(slots.take(1).unwrap_err().contains("per user"));
        let _c = slots.take(2).unwrap();
        assert!(slots.take(3).unwrap_err().contains("max_connections"));
        drop(a);
        assert!(slots.take(1).is_ok());
    }
}
