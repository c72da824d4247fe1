//! UD multicast groups (spec §15.8): which QPs of the device are attached to which group GID.
//!
//! Bounded: at most `max_groups` groups and `max_per_group` QPs in one group, the limits the
//! device advertises (`max_mcast_grp`, `max_mcast_qp_attach`).

use std::collections::HashMap;

use thiserror::Error;

/// Groups a device joins at most (advertised as `max_mcast_grp`).
pub const MAX_MCAST_GROUPS: u32 = 1024;
/// QPs attached to one group at most (advertised as `max_mcast_qp_attach`).
pub const MAX_MCAST_QP_ATTACH: u32 = 64;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum McastError {
    #[error("not a multicast GID")]
    NotMulticast,
    #[error("multicast group or attachment limit reached")]
    Full,
    #[error("the QP is not attached to the group")]
    NotAttached,
}

/// Is `gid` a multicast group address: IPv4-mapped 224.0.0.0/4 or IPv6 ff00::/8?
pub fn is_multicast_gid(gid: &[u8; 16]) -> bool {
    if crate::wire::is_ipv4_mapped(gid) {
        gid[12] & 0xf0 == 0xe0
    } else {
        gid[0] == 0xff
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct McastTable {
    groups: HashMap<[u8; 16], Vec<u32>>,
    max_groups: u32,
    max_per_group: u32,
}

impl McastTable {
    pub fn new(max_groups: u32, max_per_group: u32) -> McastTable {
        McastTable {
            groups: HashMap::new(),
            max_groups,
            max_per_group,
        }
    }

    /// Attach `qpn` to `gid` (attaching twice changes nothing).
    pub fn attach(&mut self, gid: [u8; 16], qpn: u32) -> Result<(), McastError> {
        if !is_multicast_gid(&gid) {
            return Err(McastError::NotMulticast);
        }
        let groups = self.groups.len();
        match self.groups.get_mut(&gid) {
            Some(qps) if qps.contains(&qpn) => Ok(()),
            Some(qps) if qps.len() as u32 >= self.max_per_group => Err(McastError::Full),
            Some(qps) => {
                qps.push(qpn);
                Ok(())
            }
            None if groups as u32 >= self.max_groups || self.max_per_group == 0 => {
                Err(McastError::Full)
            }
            None => {
                self.groups.insert(gid, vec![qpn]);
                Ok(())
            }
        }
    }

    pub fn detach(&mut self, gid: &[u8; 16], qpn: u32) -> Result<(), McastError> {
        let qps = self.groups.get_mut(gid).ok_or(McastError::NotAttached)?;
        let i = qps
            .iter()
            .position(|&q| q == qpn)
            .ok_or(McastError::NotAttached)?;
        qps.swap_remove(i);
        if qps.is_empty() {
            self.groups.remove(gid);
        }
        Ok(())
    }

    /// Whether `qpn` is attached to any group.
    pub fn is_attached(&self, qpn: u32) -> bool {
        self.groups.values().any(|qps| qps.contains(&qpn))
    }

    /// Detach `qpn` from every group (DESTROY_QP).
    pub fn detach_qp(&mut self, qpn: u32) {
        self.groups.retain(|_, qps| {
            qps.retain(|&q| q != qpn);
            !qps.is_empty()
        });
    }

    /// The QPs attached to `gid` (empty if none).
    pub fn members(&self, gid: &[u8; 16]) -> &[u32] {
        self.groups.get(gid).map_or(&[], Vec::as_slice)
    }

    pub fn has_group(&self, gid: &[u8; 16]) -> bool {
        // Per frame: skip hashing while no QP is attached to any group (the common case).
        !self.groups.is_empty() && self.groups.contains_key(gid)
    }

    pub fn clear(&mut self) {
        self.groups.clear();
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> [u8; 16] {
        crate::wire::frame::gid_from_ipv4(a)
    }

    #[test]
    fn multicast_gids() {
        assert!(is_multicast_gid(&v4([224, 0, 0, 1])));
        assert!(is_multicast_gid(&v4([239, 255, 1, 2])));
        assert!(!is_multicast_gid(&v4([10, 0, 0, 1])));
        assert!(!is_multicast_gid(&v4([240, 0, 0, 1])));
        let mut g6 = [0u8; 16];
        g6[0] = 0xff;
        g6[1] = 0x0e;
        assert!(is_multicast_gid(&g6));
        g6[0] = 0xfe;
        assert!(!is_multicast_gid(&g6));
    }

    #[test]
    fn attach_detach_and_limits() {
        let g = v4([239, 1, 1, 1]);
        let mut t = McastTable::new(2, 2);
        assert_eq!(
            t.attach(v4([10, 0, 0, 1]), 5),
            Err(McastError::NotMulticast)
        );
        t.attach(g, 5).unwrap();
        t.attach(g, 5).unwrap();
        assert_eq!(t.members(&g), &[5]);
        t.attach(g, 6).unwrap();
        assert_eq!(t.attach(g, 7), Err(McastError::Full), "QPs per group");
        t.attach(v4([239, 1, 1, 2]), 5).unwrap();
        assert_eq!(
            t.attach(v4([239, 1, 1, 3]), 5),
            Err(McastError::Full),
            "groups"
        );
        assert_eq!(t.detach(&g, 9), Err(McastError::NotAttached));
        t.detach(&g, 6).unwrap();
        assert_eq!(t.members(&g), &[5]);
        t.detach_qp(5);
        assert_eq!(t.group_count(), 0);
        assert!(!t.has_group(&g));
    }
}
