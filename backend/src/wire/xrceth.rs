//! XRC Extended Transport Header (XRCETH, IBTA Vol. 1 rel. 1.2.1 XRC, 4 bytes; spec §15.2): 8 reserved
//! bits, then the 24-bit XRC SRQ number at the target that receives the request (spec §13.7).

fixed_header! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Xrceth("XRCETH", 4) {
        /// XRC SRQ number (24 bits).
        pub srqn: u32 = Be24 @ 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixed_header::assert_round_trip;

    #[test]
    fn round_trip_masks_to_24_bits() {
        let b = assert_round_trip(&Xrceth { srqn: 0x12_3456 });
        assert_eq!(b, [0, 0x12, 0x34, 0x56]);
        // The reserved byte is ignored on receive.
        assert_eq!(Xrceth::parse(&[0xff, 0, 0, 7]).map(|x| x.0.srqn), Ok(7));
        let mut b = [0u8; 4];
        Xrceth { srqn: 0xff00_0001 }.write(&mut b).unwrap();
        assert_eq!(b, [0, 0, 0, 1]);
    }
}
