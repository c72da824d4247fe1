//! Atomic Extended Transport Header (IBTA 9.3.4, 28 bytes): VA, R_Key, swap/add data, compare data.

fixed_header! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct AtomicEth("AtomicETH", 28) {
        pub va: u64 = Be64 @ 0,
        pub rkey: u32 = Be32 @ 8,
        /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
        pub swap_add: u64 = Be64 @ 12,
        /// Compare value (CMP_SWAP; ignored by FETCH_ADD).
        pub compare: u64 = Be64 @ 20,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixed_header::assert_round_trip;

    #[test]
    fn round_trip() {
        let b = assert_round_trip(&AtomicEth {
            va: 0x1000,
            rkey: 0x0102_0304,
            swap_add: 0x1111_2222_3333_4444,
            compare: 0x5555_6666_7777_8888,
        });
        assert_eq!(&b[8..12], &[1, 2, 3, 4]);
        assert_eq!(&b[12..14], &[0x11, 0x11]);
        assert_eq!(&b[26..28], &[0x88, 0x88]);
    }
}
