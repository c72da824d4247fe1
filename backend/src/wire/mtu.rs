//! IB path MTU enum ↔ bytes, and the largest IB MTU an Ethernet (IP) MTU can carry.

use super::{HdrMask, ICRC_LEN};

/// Worst-case RoCEv2 bytes around a payload inside the IP MTU: IPv6 header (40), UDP (8), BTH
/// (12), the largest extension-header set of a payload-carrying opcode (RETH + ImmDt = 20) and the
/// ICRC (4). Payloads of a full MTU are multiples of 4, so no pad.
pub const MAX_IP_OVERHEAD: u32 =
    40 + 8 + 12 + (HdrMask::RETH.union(HdrMask::IMMDT).len() as u32) + ICRC_LEN as u32;

/// Bytes of an IB MTU enum value (1 = 256 … 5 = 4096), as in `ib_mtu` / `path_mtu`.
pub const fn ib_mtu_bytes(mtu: u32) -> Option<u32> {
    match mtu {
        1..=5 => Some(128 << mtu),
        _ => None,
    }
}

/// The largest IB MTU enum whose full-size packets fit an IP MTU of `ip_mtu` bytes (the netdev
/// MTU); `None` if not even 256 fits.
pub const fn ib_mtu_for_ip_mtu(ip_mtu: u32) -> Option<u32> {
    let mut m = 5;
    while m >= 1 {
        if (128u32 << m) + MAX_IP_OVERHEAD <= ip_mtu {
            return Some(m);
        }
        m -= 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_values() {
        assert_eq!(ib_mtu_bytes(1), Some(256));
        assert_eq!(ib_mtu_bytes(3), Some(1024));
        assert_eq!(ib_mtu_bytes(5), Some(4096));
        assert_eq!(ib_mtu_bytes(0), None);
        assert_eq!(ib_mtu_bytes(6), None);
    }

    #[test]
    fn from_ethernet_mtu() {
        assert_eq!(MAX_IP_OVERHEAD, 84);
        assert_eq!(ib_mtu_for_ip_mtu(1500), Some(3)); // 1024, like rxe on a 1500 netdev
        assert_eq!(ib_mtu_for_ip_mtu(9000), Some(5));
        assert_eq!(ib_mtu_for_ip_mtu(4096 + 84), Some(5));
        assert_eq!(ib_mtu_for_ip_mtu(4096 + 83), Some(4));
        assert_eq!(ib_mtu_for_ip_mtu(576), Some(1));
        assert_eq!(ib_mtu_for_ip_mtu(300), None);
    }
}
