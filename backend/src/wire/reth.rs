//! RDMA Extended Transport Header (IBTA 9.3.3, 16 bytes): VA, R_Key, DMA length.

fixed_header! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Reth("RETH", 16) {
        pub va: u64 = Be64 @ 0,
        pub rkey: u32 = Be32 @ 8,
        pub dma_len: u32 = Be32 @ 12,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixed_header::assert_round_trip;

    #[test]
    fn round_trip() {
        let b = assert_round_trip(&Reth {
            va: 0x0102_0304_0506_0708,
            rkey: 0x1122_3344,
            dma_len: 0xdead_beef,
        });
        assert_eq!(&b[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[8..], &[0x11, 0x22, 0x33, 0x44, 0xde, 0xad, 0xbe, 0xef]);
    }
}
