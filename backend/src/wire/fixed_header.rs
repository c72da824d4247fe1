//! The fixed-length transport headers (RETH, DETH, AtomicETH, …) are runs of big-endian fields at
//! fixed offsets: [`fixed_header!`] writes their struct, `LEN`, `parse` and `write` from one field
//! table, so each header file holds only its layout (and its tests).

use super::{be16, be24, be32, be64};

/// How one big-endian field of a fixed header is read and written.
pub(crate) trait BeField {
    type Value;
    fn get(b: &[u8], at: usize) -> Self::Value;
    fn put(b: &mut [u8], at: usize, v: Self::Value);
}

pub(crate) struct Be16;
/// 24 bits (QPNs, SRQNs): a wider value is truncated to its low 24 bits on write.
pub(crate) struct Be24;
pub(crate) struct Be32;
pub(crate) struct Be64;

impl BeField for Be24 {
    type Value = u32;
    #[inline]
    fn get(b: &[u8], at: usize) -> u32 {
        be24(b, at)
    }
    #[inline]
    fn put(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 3].copy_from_slice(&(v & 0x00ff_ffff).to_be_bytes()[1..]);
    }
}

/// The whole-byte widths: the primitive's own big-endian conversion.
macro_rules! whole_bytes_field {
    ($codec:ident, $value:ty, $get:ident) => {
        impl BeField for $codec {
            type Value = $value;
            #[inline]
            fn get(b: &[u8], at: usize) -> $value {
                $get(b, at)
            }
            #[inline]
            fn put(b: &mut [u8], at: usize, v: $value) {
                b[at..at + std::mem::size_of::<$value>()].copy_from_slice(&v.to_be_bytes());
            }
        }
    };
}

whole_bytes_field!(Be16, u16, be16);
whole_bytes_field!(Be32, u32, be32);
whole_bytes_field!(Be64, u64, be64);

/// `fixed_header! { #[derive(..)] pub struct Name("LABEL", LEN) { pub field: type = Be32 @ offset, .. } }`
/// defines the struct and `Name::LEN`, `Name::parse` (checks the length, returns the rest of the
/// buffer) and `Name::write` (checks the room, sends the bytes no field covers as zero: they are
/// reserved). `LABEL` names the header in [`super::WireError`].
macro_rules! fixed_header {
    (
        $(#[$attr:meta])*
        pub struct $name:ident($label:literal, $len:literal) {
            $( $(#[$field_attr:meta])* pub $field:ident: $ty:ty = $codec:ident @ $at:literal, )+
        }
    ) => {
        $(#[$attr])*
        pub struct $name {
            $( $(#[$field_attr])* pub $field: $ty, )+
        }

        impl $name {
            pub const LEN: usize = $len;

            pub fn parse(buf: &[u8]) -> Result<($name, &[u8]), $crate::wire::WireError> {
                use $crate::wire::fixed_header::BeField as _;
                let (b, rest) = $crate::wire::take(buf, Self::LEN, $label)?;
                Ok((
                    $name {
                        $( $field: $crate::wire::fixed_header::$codec::get(b, $at), )+
                    },
                    rest,
                ))
            }

            pub fn write(&self, buf: &mut [u8]) -> Result<usize, $crate::wire::WireError> {
                use $crate::wire::fixed_header::BeField as _;
                let b = $crate::wire::out(buf, Self::LEN, $label)?;
                b.fill(0);
                $( $crate::wire::fixed_header::$codec::put(b, $at, self.$field); )+
                Ok(Self::LEN)
            }
        }

        #[cfg(test)]
        impl $crate::wire::fixed_header::FixedHeader for $name {
            const LEN: usize = $len;
            fn parse(buf: &[u8]) -> Result<($name, &[u8]), $crate::wire::WireError> {
                $name::parse(buf)
            }
            fn write(&self, buf: &mut [u8]) -> Result<usize, $crate::wire::WireError> {
                $name::write(self, buf)
            }
        }
    };
}

/// What [`fixed_header!`] defines, as a trait so that one test checks every header's length
/// handling.
#[cfg(test)]
pub(crate) trait FixedHeader: Sized + PartialEq + std::fmt::Debug {
    const LEN: usize;
    fn parse(buf: &[u8]) -> Result<(Self, &[u8]), super::WireError>;
    fn write(&self, buf: &mut [u8]) -> Result<usize, super::WireError>;
}

/// Writes `h` over junk and checks that it parses back to itself with nothing left, and that one
/// byte less fails both ways; returns the bytes for the caller's layout checks (the junk shows
/// whether reserved bytes were sent as zero).
#[cfg(test)]
pub(crate) fn assert_round_trip<H: FixedHeader>(h: &H) -> Vec<u8> {
    let mut b = vec![0xaa; H::LEN];
    assert_eq!(h.write(&mut b), Ok(H::LEN));
    let (back, rest) = H::parse(&b).expect("a whole header parses");
    assert_eq!(&back, h);
    assert!(rest.is_empty());
    assert!(H::parse(&b[..H::LEN - 1]).is_err());
    assert!(h.write(&mut vec![0; H::LEN - 1]).is_err());
    b
}
