//! Base Transport Header (IBTA 9.2, 12 bytes).
//!
//! ```text
//! byte 0   OpCode
//! byte 1   SE(7) M(6) PadCnt(5:4) TVer(3:0)
//! 2..4     P_Key
//! byte 4   resv8a; RoCEv2 uses bit 7 = FECN, bit 6 = BECN (masked to 0xFF for the ICRC)
//! 5..8     DestQP (24 bits)
//! byte 8   AckReq(7) resv7
//! 9..12    PSN (24 bits)
//! ```

use super::{be16, be24, out, take, Opcode, WireError};

/// PSNs and QPNs are 24-bit.
pub const PSN_MASK: u32 = 0x00ff_ffff;
pub const QPN_MASK: u32 = 0x00ff_ffff;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    pub mig_req: bool,
    /// Pad count (0..=3). [`super::PacketBuilder`] computes it from the payload length.
    pub pad_count: u8,
    /// Transport header version; must be 0.
    pub tver: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    pub const LEN: usize = 12;

    /// A BTH with defaults: P_Key 0xffff, everything else 0/false.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: super::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: dest_qp & QPN_MASK,
            ack_req: false,
            psn: psn & PSN_MASK,
        }
    }

    /// Parse; fails with `UnknownOpcode` for opcodes not in the table. TVer is reported as is
    /// (the frame parser rejects TVer != 0).
    pub fn parse(buf: &[u8]) -> Result<(Bth, &[u8]), WireError> {
        let (b, rest) = take(buf, Self::LEN, "BTH")?;
        let opcode = Opcode::try_from(b[0])?;
        Ok((
            Bth {
                opcode,
                solicited: b[1] & 0x80 != 0,
                mig_req: b[1] & 0x40 != 0,
                pad_count: (b[1] >> 4) & 0x3,
                tver: b[1] & 0xf,
                pkey: be16(b, 2),
                fecn: b[4] & 0x80 != 0,
                becn: b[4] & 0x40 != 0,
                dest_qp: be24(b, 5),
                ack_req: b[8] & 0x80 != 0,
                psn: be24(b, 9),
            },
            rest,
        ))
    }

    pub fn write(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let b = out(buf, Self::LEN, "BTH")?;
        b[0] = self.opcode as u8;
        b[1] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad_count & 3) << 4)
            | (self.tver & 0xf);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        b[5..8].copy_from_slice(&(self.dest_qp & QPN_MASK).to_be_bytes()[1..]);
        b[8] = u8::from(self.ack_req) << 7;
        b[9..12].copy_from_slice(&(self.psn & PSN_MASK).to_be_bytes()[1..]);
        Ok(Self::LEN)
    }
}

/// PSN arithmetic modulo 2^24: `a - b` as a signed distance in -2^23..2^23.
#[inline]
pub fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// `psn + n` modulo 2^24.
#[inline]
pub fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_all_fields() {
        let h = Bth {
            opcode: Opcode::RcWriteOnlyImm,
            solicited: true,
            mig_req: true,
            pad_count: 3,
            tver: 0,
            pkey: 0x1234,
            fecn: true,
            becn: false,
            dest_qp: 0xabcdef,
            ack_req: true,
            psn: 0x123456,
        };
        let mut b = [0u8; 12];
        assert_eq!(h.write(&mut b), Ok(12));
        assert_eq!(
            b,
            [0x0b, 0xf0, 0x12, 0x34, 0x80, 0xab, 0xcd, 0xef, 0x80, 0x12, 0x34, 0x56]
        );
        let mut with_tail = b.to_vec();
        with_tail.push(7);
        let (p, rest) = Bth::parse(&with_tail).unwrap();
        assert_eq!(p, h);
        assert_eq!(rest, &[7]);
    }

    #[test]
    fn truncated_and_unknown() {
        assert!(matches!(
            Bth::parse(&[0u8; 11]),
            Err(WireError::Truncated {
                need: 12,
                have: 11,
                ..
            })
        ));
        let mut b = [0u8; 12];
        b[0] = 0x15;
        assert_eq!(Bth::parse(&b), Err(WireError::UnknownOpcode(0x15)));
        assert!(Bth::new(Opcode::RcAck, 1, 2).write(&mut [0u8; 11]).is_err());
    }

    #[test]
    fn masks_24_bit_fields() {
        let h = Bth::new(Opcode::RcSendOnly, 0xff12_3456, 0xff65_4321);
        assert_eq!(h.dest_qp, 0x123456);
        assert_eq!(h.psn, 0x654321);
    }

    #[test]
    fn psn_math_wraps() {
        assert_eq!(psn_diff(5, 3), 2);
        assert_eq!(psn_diff(3, 5), -2);
        assert_eq!(psn_diff(0, 0xffffff), 1);
        assert_eq!(psn_diff(0xffffff, 0), -1);
        assert_eq!(psn_add(0xffffff, 2), 1);
    }
}
