//! Atomic Acknowledge Extended Transport Header (IBTA 9.5.3, 8 bytes): the original remote data.

fixed_header! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct AtomicAckEth("AtomicAckETH", 8) {
        pub orig: u64 = Be64 @ 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixed_header::assert_round_trip;

    #[test]
    fn round_trip() {
        let b = assert_round_trip(&AtomicAckEth {
            orig: 0x0102_0304_0506_0708,
        });
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
