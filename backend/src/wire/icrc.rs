//! RoCEv2 invariant CRC (IBTA Annex A17.3.3; spec §15).
//!
//! ICRC = CRC-32 (IEEE 802.3 polynomial, reflected, init 0xFFFFFFFF, final xor 0xFFFFFFFF) over:
//! 8 bytes of 0xFF (standing in for the masked LRH), the IP header with the variant fields set to
//! all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit), the UDP
//! header with the checksum set to 0xFFFF, the BTH with byte 4 (resv8a, carrying FECN/BECN) set to
//! 0xFF, then the extension headers, payload and pad. It is appended little-endian.
//!
//! The CRC runs on `crc32fast` (PCLMULQDQ/SSE4.2 where the CPU has them, a table otherwise); a
//! slice-by-8 table implementation written here is kept as a cross-check in the tests.

use super::{ipv4::Ipv4Header, ipv6::Ipv6Header, udp::UdpHeader, Bth, WireError};

#[cfg(test)]
const POLY: u32 = 0xedb8_8320;

#[cfg(test)]
const fn make_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

#[cfg(test)]
static TABLES: [[u32; 256]; 8] = make_tables();

/// Advance a raw (not inverted) reflected CRC-32 register over `data`.
#[inline]
pub fn crc32_update(crc: u32, data: &[u8]) -> u32 {
    // crc32fast keeps the finalised (inverted) value as its state.
    let mut h = crc32fast::Hasher::new_with_initial(!crc);
    h.update(data);
    !h.finalize()
}

/// The same as [`crc32_update`] with the slice-by-8 tables (test cross-check).
#[cfg(test)]
fn crc32_update_table(mut crc: u32, data: &[u8]) -> u32 {
    let t = &TABLES;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][c[4] as usize]
            ^ t[2][c[5] as usize]
            ^ t[1][c[6] as usize]
            ^ t[0][c[7] as usize];
    }
    for &b in chunks.remainder() {
        crc = (crc >> 8) ^ t[0][((crc ^ u32::from(b)) & 0xff) as usize];
    }
    crc
}

/// Standard CRC-32 (as in zlib/Ethernet) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    !crc32_update(0xffff_ffff, data)
}

/// The masked LRH the ICRC starts with.
const LRH_LEN: usize = 8;
/// The longest masked header run: LRH, IPv6, UDP and BTH.
const MASKED_MAX: usize = LRH_LEN + Ipv6Header::LEN + UdpHeader::LEN + Bth::LEN;

/// A running ICRC computation. Feed the (unmasked) IP header, UDP header and BTH with
/// [`Icrc::start`], then the rest with [`Icrc::update`], then [`Icrc::finish`].
#[derive(Debug, Clone, Copy)]
pub struct Icrc {
    crc: u32,
}

impl Icrc {
    /// Starts an ICRC over `ip` (a 20-byte IPv4 or 40-byte IPv6 header, chosen by the version
    /// nibble), `udp` (8 bytes) and `bth` (12 bytes); masks are applied to copies.
    pub fn start(ip: &[u8], udp: &[u8], bth: &[u8]) -> Result<Icrc, WireError> {
        // The masked headers are gathered into one buffer and hashed in one call: four short
        // CRC updates cost more than the 1 KiB payload after them (`make bench` wire).
        let mut h = [0xffu8; MASKED_MAX];
        let ip_len = match ip.first().map(|b| b >> 4) {
            Some(4) => Ipv4Header::LEN,
            Some(6) => Ipv6Header::LEN,
            v => return Err(WireError::BadIpVersion(v.unwrap_or(0))),
        };
        let ip = ip.get(..ip_len).ok_or(WireError::Truncated {
            what: if ip_len == Ipv4Header::LEN {
                "ICRC IPv4 header"
            } else {
                "ICRC IPv6 header"
            },
            need: ip_len,
            have: ip.len(),
        })?;
        let udp = udp.get(..UdpHeader::LEN).ok_or(WireError::Truncated {
            what: "ICRC UDP header",
            need: UdpHeader::LEN,
            have: udp.len(),
        })?;
        let bth = bth.get(..Bth::LEN).ok_or(WireError::Truncated {
            what: "ICRC BTH",
            need: Bth::LEN,
            have: bth.len(),
        })?;
        // 8 bytes of 0xFF stand for the LRH; then the headers, their variant fields all ones.
        let (i, u, b) = (LRH_LEN, LRH_LEN + ip_len, LRH_LEN + ip_len + UdpHeader::LEN);
        let n = b + Bth::LEN;
        h[i..u].copy_from_slice(ip);
        h[u..b].copy_from_slice(udp);
        h[b..n].copy_from_slice(bth);
        if ip_len == Ipv4Header::LEN {
            h[i + 1] = 0xff; // TOS
            h[i + 8] = 0xff; // TTL
            h[i + 10] = 0xff; // header checksum
            h[i + 11] = 0xff;
        } else {
            h[i] |= 0x0f; // traffic class (high nibble)
            h[i + 1] = 0xff; // traffic class (low nibble) + flow label
            h[i + 2] = 0xff;
            h[i + 3] = 0xff;
            h[i + 7] = 0xff; // hop limit
        }
        h[u + 6] = 0xff; // UDP checksum
        h[u + 7] = 0xff;
        h[b + 4] = 0xff; // BTH resv8a (FECN/BECN)
        Ok(Icrc {
            crc: crc32_update(0xffff_ffff, &h[..n]),
        })
    }

    /// Feed the bytes after the BTH (extension headers, payload, pad), in pieces.
    pub fn update(&mut self, data: &[u8]) {
        self.crc = crc32_update(self.crc, data);
    }

    /// The ICRC value; on the wire it is `finish().to_le_bytes()`.
    pub fn finish(self) -> u32 {
        !self.crc
    }
}

/// ICRC of a packet given as IP header, UDP header and `bth_to_pad` (BTH through pad, no ICRC).
pub fn compute(ip: &[u8], udp: &[u8], bth_to_pad: &[u8]) -> Result<u32, WireError> {
    let (bth, rest) = super::take(bth_to_pad, Bth::LEN, "BTH")?;
    let mut c = Icrc::start(ip, udp, bth)?;
    c.update(rest);
    Ok(c.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time reference CRC-32, written from the definition.
    fn crc32_bitwise(data: &[u8]) -> u32 {
        let mut crc = 0xffff_ffffu32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn crc32_check_value() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32_bitwise(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn table_matches_bitwise_for_all_lengths() {
        let data: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for n in 0..data.len() {
            assert_eq!(crc32(&data[..n]), crc32_bitwise(&data[..n]), "len {n}");
        }
        // Split updates compose, and the table implementation agrees at every split.
        let a = crc32_update(0xffff_ffff, &data[..77]);
        assert_eq!(!crc32_update(a, &data[77..]), crc32(&data));
        for n in 0..data.len() {
            let t = crc32_update_table(0xffff_ffff, &data[..n]);
            assert_eq!(t, crc32_update(0xffff_ffff, &data[..n]), "len {n}");
            assert_eq!(!crc32_update_table(t, &data[n..]), crc32(&data));
        }
    }

    #[test]
    fn seed_after_masked_lrh() {
        // rxe documents its seed 0xdebb20e3 as the CRC register after 8 bytes of 0xFF.
        assert_eq!(crc32_update(0xffff_ffff, &[0xff; 8]), 0xdebb_20e3);
    }

    /// The ICRC from its definition (A17.3.3): one bitwise CRC over the masked LRH, the
    /// headers with their variant fields set to ones, and the rest, for IPv4 and IPv6
    /// headers of varied content.
    #[test]
    fn icrc_matches_its_definition_for_both_ip_versions() {
        let mut x = 0x9e37_79b9u32;
        let mut byte = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        };
        for round in 0..64 {
            let v6 = round % 2 == 1;
            let mut ip: Vec<u8> = (0..if v6 { 40 } else { 20 }).map(|_| byte()).collect();
            ip[0] = if v6 { 0x60 | (ip[0] & 0x0f) } else { 0x45 };
            let udp: Vec<u8> = (0..8).map(|_| byte()).collect();
            let rest: Vec<u8> = (0..12 + round * 7).map(|_| byte()).collect();
            let mut masked = vec![0xffu8; 8];
            let mut m = ip.clone();
            if v6 {
                m[0] |= 0x0f;
                m[1..4].fill(0xff);
                m[7] = 0xff;
            } else {
                m[1] = 0xff;
                m[8] = 0xff;
                m[10..12].fill(0xff);
            }
            masked.extend_from_slice(&m);
            let mut u = udp.clone();
            u[6..8].fill(0xff);
            masked.extend_from_slice(&u);
            let mut r = rest.clone();
            r[4] = 0xff;
            masked.extend_from_slice(&r);
            assert_eq!(
                compute(&ip, &udp, &rest).unwrap(),
                crc32_bitwise(&masked),
                "round {round} (IPv{})",
                if v6 { 6 } else { 4 }
            );
        }
    }

    #[test]
    fn icrc_masks_variant_fields() {
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        let udp = [0xc0, 0, 0x12, 0xb7, 0, 24, 0, 0];
        let bth = [0x11u8, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 5];
        let base = compute(&ip, &udp, &[&bth[..], &[0u8; 4]].concat()).unwrap();
        let mut ip2 = ip;
        ip2[1] = 0x03;
        ip2[8] = 17;
        ip2[10] = 0x12;
        let mut udp2 = udp;
        udp2[6] = 0x55;
        let mut bth2 = bth;
        bth2[4] = 0x80;
        assert_eq!(
            compute(&ip2, &udp2, &[&bth2[..], &[0u8; 4]].concat()).unwrap(),
            base
        );
        // An invariant field does change it.
        ip2[12] = 1;
        assert_ne!(
            compute(&ip2, &udp2, &[&bth2[..], &[0u8; 4]].concat()).unwrap(),
            base
        );
        assert!(compute(&[0x55; 20], &udp, &bth).is_err());
        assert!(compute(&ip, &udp[..7], &bth).is_err());
        assert!(compute(&ip, &udp, &bth[..11]).is_err());
    }
}
