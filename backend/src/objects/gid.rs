//! The port's GID table (ADD_GID / DEL_GID): index → GID and type.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use vrdma_spec::{VRDMA_GID_TYPE_ROCE_V1, VRDMA_GID_TYPE_ROCE_V2};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    pub gid: [u8; 16],
    pub gid_type: u32,
}

impl GidEntry {
    /// The IP address of the GID (IPv4 for IPv4-mapped GIDs).
    pub fn ip(&self) -> IpAddr {
        gid_to_ip(&self.gid)
    }
}

/// `::ffff:a.b.c.d` → IPv4, everything else IPv6.
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// IP → GID (IPv4 mapped into `::ffff:0:0/96`).
pub fn ip_to_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Is the GID IPv4-mapped?
pub fn gid_is_ipv4(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// Errors of ADD_GID / DEL_GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GidError {
    #[error("GID index out of range")]
    BadIndex,
    #[error("bad GID type")]
    BadType,
    #[error("no GID at this index")]
    NotFound,
}

#[derive(Debug, Clone)]
pub struct GidTable {
    entries: Vec<Option<GidEntry>>,
    /// The RoCEv2 entries as (GID, index), in index order: every frame in and out looks its
    /// addresses up here, and a port has a handful of them in a table of `max_gid` slots.
    v2: Vec<([u8; 16], u32)>,
}

impl GidTable {
    pub fn new(size: u32) -> Self {
        GidTable {
            entries: vec![None; size as usize],
            v2: Vec::new(),
        }
    }

    pub fn len(&self) -> u32 {
        self.entries.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// ADD_GID: set (or replace) entry `index`.
    pub fn add(&mut self, index: u32, gid_type: u32, gid: [u8; 16]) -> Result<(), GidError> {
        if gid_type != VRDMA_GID_TYPE_ROCE_V1 && gid_type != VRDMA_GID_TYPE_ROCE_V2 {
            return Err(GidError::BadType);
        }
        let e = self
            .entries
            .get_mut(index as usize)
            .ok_or(GidError::BadIndex)?;
        *e = Some(GidEntry { gid, gid_type });
        self.reindex();
        Ok(())
    }

    /// DEL_GID: clear entry `index`.
    pub fn del(&mut self, index: u32) -> Result<(), GidError> {
        let e = self
            .entries
            .get_mut(index as usize)
            .ok_or(GidError::BadIndex)?;
        e.take().ok_or(GidError::NotFound)?;
        self.reindex();
        Ok(())
    }

    /// Rebuild `v2` (ADD_GID / DEL_GID are rare; lookups are per frame).
    fn reindex(&mut self) {
        self.v2.clear();
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(e) = e.filter(|e| e.gid_type == VRDMA_GID_TYPE_ROCE_V2) {
                self.v2.push((e.gid, i as u32));
            }
        }
    }

    pub fn get(&self, index: u32) -> Option<&GidEntry> {
        self.entries.get(index as usize).and_then(|e| e.as_ref())
    }

    /// Index of a RoCEv2 entry with exactly this GID.
    pub fn find_v2(&self, gid: &[u8; 16]) -> Option<u32> {
        self.v2.iter().find(|(g, _)| g == gid).map(|&(_, i)| i)
    }

    /// Is `ip` one of the port's RoCEv2 addresses? (port demux: frames to our GIDs → engine)
    pub fn is_local_ip(&self, ip: IpAddr) -> bool {
        self.find_v2(&ip_to_gid(ip)).is_some()
    }

    /// Is the IPv4 address one of ours?
    pub fn is_local_ipv4(&self, ip: Ipv4Addr) -> bool {
        self.is_local_ip(IpAddr::V4(ip))
    }

    /// Remove every entry (device reset).
    pub fn clear(&mut self) {
        for e in &mut self.entries {
            *e = None;
        }
        self.v2.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_del_lookup_and_local_ips() {
        let mut t = GidTable::new(4);
        let v4: Ipv4Addr = "192.168.1.7".parse().unwrap();
        let v6: Ipv6Addr = "fd00::7".parse().unwrap();
        t.add(0, VRDMA_GID_TYPE_ROCE_V2, ip_to_gid(IpAddr::V4(v4)))
            .unwrap();
        t.add(1, VRDMA_GID_TYPE_ROCE_V1, ip_to_gid(IpAddr::V6(v6)))
            .unwrap();
        assert!(t.is_local_ipv4(v4));
        assert!(
            !t.is_local_ip(IpAddr::V6(v6)),
            "RoCEv1 entries are not RoCEv2 addresses"
        );
        t.add(2, VRDMA_GID_TYPE_ROCE_V2, v6.octets()).unwrap();
        assert!(t.is_local_ip(IpAddr::V6(v6)));
        assert_eq!(t.find_v2(&v6.octets()), Some(2));
        // The same GID at a lower index too: the lowest index answers; replaced by RoCEv1,
        // it no longer does.
        t.add(1, VRDMA_GID_TYPE_ROCE_V2, v6.octets()).unwrap();
        assert_eq!(t.find_v2(&v6.octets()), Some(1));
        t.add(1, VRDMA_GID_TYPE_ROCE_V1, v6.octets()).unwrap();
        assert_eq!(t.find_v2(&v6.octets()), Some(2));
        assert_eq!(t.get(0).unwrap().ip(), IpAddr::V4(v4));
        assert!(gid_is_ipv4(&t.get(0).unwrap().gid));
        assert!(!gid_is_ipv4(&v6.octets()));
        assert_eq!(gid_to_ip(&v6.octets()), IpAddr::V6(v6));
        assert_eq!(
            t.add(4, VRDMA_GID_TYPE_ROCE_V2, [0; 16]),
            Err(GidError::BadIndex)
        );
        assert_eq!(t.add(3, 0, [0; 16]), Err(GidError::BadType));
        assert_eq!(t.del(3), Err(GidError::NotFound));
        assert_eq!(t.del(9), Err(GidError::BadIndex));
        t.del(0).unwrap();
        assert!(!t.is_local_ipv4(v4));
        t.clear();
        assert!(t.get(2).is_none());
        assert_eq!(t.len(), 4);
    }
}
