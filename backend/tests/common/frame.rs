//! Offsets in an untagged IPv4 RoCEv2 frame, and resealing one after a test mutated it.

pub const ETH: usize = 14;
pub const IP: usize = 20;
pub const UDP: usize = 8;
/// Offset of the BTH in an untagged IPv4 RoCEv2 frame.
pub const BTH: usize = ETH + IP + UDP;

/// Fix IPv4 total length + checksum, UDP length and the ICRC of an untagged IPv4 RoCEv2 frame
/// after it was mutated, so that it passes every check before the transport.
pub fn reseal(f: &mut [u8]) {
    if f.len() < BTH + 12 + 4 {
        return;
    }
    let ip_len = (f.len() - ETH) as u16;
    f[ETH + 2..ETH + 4].copy_from_slice(&ip_len.to_be_bytes());
    f[ETH + 10] = 0;
    f[ETH + 11] = 0;
    let mut s = 0u32;
    for i in (ETH..ETH + IP).step_by(2) {
        s += u32::from(u16::from_be_bytes([f[i], f[i + 1]]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    f[ETH + 10..ETH + 12].copy_from_slice(&(!(s as u16)).to_be_bytes());
    let udp_len = (f.len() - ETH - IP) as u16;
    f[ETH + IP + 4..ETH + IP + 6].copy_from_slice(&udp_len.to_be_bytes());
    let n = f.len();
    // Only fails on headers shorter than checked above; then the frame stays unsealed.
    if let Ok(c) =
        vrdma_backend::wire::icrc::compute(&f[ETH..ETH + IP], &f[ETH + IP..BTH], &f[BTH..n - 4])
    {
        f[n - 4..].copy_from_slice(&c.to_le_bytes());
    }
}
