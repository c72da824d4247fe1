//! Unit tests of `opcode`.

use super::*;

#[test]
fn every_variant_has_a_row_and_table_is_consistent() {
    for (i, row) in OPCODES.iter().enumerate() {
        assert_eq!(lookup(row.opcode as u8), Some(row));
        assert_eq!(row.opcode.info(), row);
        if i > 0 {
            assert!((OPCODES[i - 1].opcode as u8) < (row.opcode as u8), "sorted");
        }
        // Transport bits 7:5: 000 RC, 001 UC, 011 UD.
        let t = match row.opcode as u8 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            3 => Transport::Ud,
            5 => Transport::Xrc,
            x => panic!("bad transport bits {x}"),
        };
        assert_eq!(row.transport, t, "{}", row.name);
        let prefix = match t {
            Transport::Rc => "RC_",
            Transport::Uc => "UC_",
            Transport::Ud => "UD_",
            Transport::Xrc => "XRC_",
        };
        assert!(row.name.starts_with(prefix));
        assert_eq!(
            row.has_imm(),
            row.name.contains("IMMEDIATE"),
            "{}",
            row.name
        );
        assert_eq!(
            row.has_inv(),
            row.name.contains("INVALIDATE"),
            "{}",
            row.name
        );
    }
    assert_eq!(OPCODES.len(), 25 + 12 + 2 + 23);
}

#[test]
fn header_lengths_match_ibta() {
    let l = |o: Opcode| o.info().hdr_len;
    assert_eq!(l(Opcode::RcSendOnly), 12);
    assert_eq!(l(Opcode::RcSendOnlyImm), 16);
    assert_eq!(l(Opcode::RcSendOnlyInv), 16);
    assert_eq!(l(Opcode::RcWriteFirst), 28);
    assert_eq!(l(Opcode::RcWriteOnlyImm), 32);
    assert_eq!(l(Opcode::RcReadRequest), 28);
    assert_eq!(l(Opcode::RcReadResponseFirst), 16);
    assert_eq!(l(Opcode::RcReadResponseMiddle), 12);
    assert_eq!(l(Opcode::RcAck), 16);
    assert_eq!(l(Opcode::RcAtomicAck), 24);
    assert_eq!(l(Opcode::RcCompareSwap), 40);
    assert_eq!(l(Opcode::RcFetchAdd), 40);
    assert_eq!(l(Opcode::UdSendOnly), 20);
    assert_eq!(l(Opcode::UdSendOnlyImm), 24);
    assert_eq!(l(Opcode::UcWriteOnlyImm), 32);
    assert_eq!(l(Opcode::RcFlush), 32);
    assert_eq!(l(Opcode::RcAtomicWrite), 28);
}

#[test]
fn offsets_follow_wire_order() {
    let i = Opcode::RcWriteOnlyImm.info();
    assert_eq!(i.offset(HdrMask::RETH), Some(12));
    assert_eq!(i.offset(HdrMask::IMMDT), Some(28));
    assert_eq!(i.offset(HdrMask::AETH), None);
    let i = Opcode::RcAtomicAck.info();
    assert_eq!(i.offset(HdrMask::AETH), Some(12));
    assert_eq!(i.offset(HdrMask::ATOMIC_ACK_ETH), Some(16));
    let i = Opcode::UdSendOnlyImm.info();
    assert_eq!(i.offset(HdrMask::DETH), Some(12));
    assert_eq!(i.offset(HdrMask::IMMDT), Some(20));
    // FLUSH: the FETH precedes the RETH.
    let i = Opcode::RcFlush.info();
    assert_eq!(i.offset(HdrMask::FETH), Some(12));
    assert_eq!(i.offset(HdrMask::RETH), Some(16));
    assert!(!i.payload);
    let i = Opcode::RcAtomicWrite.info();
    assert_eq!(i.offset(HdrMask::RETH), Some(12));
    assert!(i.payload && i.is_request() && i.uses_responder_resource());
}

#[test]
fn payload_and_direction() {
    for row in &OPCODES {
        let resp = matches!(
            row.operation,
            Operation::ReadResponse | Operation::Ack | Operation::AtomicAck
        );
        assert_eq!(row.is_response(), resp);
        assert_eq!(
            row.payload,
            !matches!(
                row.operation,
                Operation::ReadRequest
                    | Operation::Ack
                    | Operation::AtomicAck
                    | Operation::CompareSwap
                    | Operation::FetchAdd
                    | Operation::Flush
            )
        );
    }
}

#[test]
fn xrc_rows_mirror_rc_with_xrceth_on_requests() {
    // Spec §15.2: XRC = RC + 0xa0; requests carry the XRCETH first, responses do not.
    let mut n = 0;
    for row in OPCODES.iter().filter(|r| r.transport == Transport::Xrc) {
        let rc = lookup(row.opcode as u8 - 0xa0).expect("RC twin");
        assert_eq!(
            (rc.operation, rc.position, rc.direction, rc.payload),
            (row.operation, row.position, row.direction, row.payload)
        );
        if row.is_request() {
            assert_eq!(row.offset(HdrMask::XRCETH), Some(12), "{}", row.name);
            assert_eq!(row.hdr_len, rc.hdr_len + 4, "{}", row.name);
        } else {
            assert!(!row.has(HdrMask::XRCETH));
            assert_eq!(row.hdr_len, rc.hdr_len, "{}", row.name);
        }
        n += 1;
    }
    assert_eq!(n, 23);
    let i = Opcode::XrcWriteOnlyImm.info();
    assert_eq!(i.offset(HdrMask::RETH), Some(16));
    assert_eq!(i.offset(HdrMask::IMMDT), Some(32));
    assert_eq!(Opcode::XrcCompareSwap.info().hdr_len, 44);
    // No XRC FLUSH / ATOMIC WRITE (spec §13.7).
    assert!(lookup(0xbc).is_none() && lookup(0xbd).is_none() && lookup(0xb5).is_none());
}

#[test]
fn unsupported_values_are_rejected() {
    let supported: Vec<u8> = OPCODES.iter().map(|r| r.opcode as u8).collect();
    for v in 0..=255u8 {
        assert_eq!(lookup(v).is_some(), supported.contains(&v), "{v:#x}");
    }
    assert!(lookup(0x15).is_none());
    assert!(lookup(0x40).is_none()); // RD
    assert!(lookup(0x81).is_none()); // CNP
    assert!(Opcode::try_from(0x18).is_err());
    assert!(Opcode::try_from(0x1e).is_err());
    assert_eq!(Opcode::try_from(0x1c), Ok(Opcode::RcFlush));
    assert_eq!(Opcode::try_from(0x1d), Ok(Opcode::RcAtomicWrite));
}
