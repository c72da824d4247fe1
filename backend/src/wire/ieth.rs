//! Invalidate Extended Transport Header (IBTA 9.3.6, 4 bytes): the R_Key to invalidate.

fixed_header! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Ieth("IETH", 4) {
        pub rkey: u32 = Be32 @ 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixed_header::assert_round_trip;

    #[test]
    fn round_trip() {
        let b = assert_round_trip(&Ieth { rkey: 0xcafe_0102 });
        assert_eq!(b, [0xca, 0xfe, 1, 2]);
    }
}
