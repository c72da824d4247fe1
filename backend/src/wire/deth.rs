//! Datagram Extended Transport Header (IBTA 9.3.2, 8 bytes): Q_Key, source QP.

fixed_header! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Deth("DETH", 8) {
        pub qkey: u32 = Be32 @ 0,
        /// Source QP number (24 bits).
        pub src_qp: u32 = Be24 @ 5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixed_header::assert_round_trip;

    #[test]
    fn round_trip() {
        let b = assert_round_trip(&Deth {
            qkey: 0x8001_0000,
            src_qp: 0x00_0001,
        });
        assert_eq!(b, [0x80, 0x01, 0, 0, 0, 0, 0, 1]);
    }
}
