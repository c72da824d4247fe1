//! `vrdma-spec`: the vrdma device ABI (virtio device ID 42) in Rust.
//!
//! This crate is a faithful mirror of `device-spec/include/vrdma_abi.h`; the normative text is
//! `device-spec/virtio-rdma.md` (comments cite its sections as §N). `tests/abi_agreement.rs`
//! compiles a C program generated from the header and proves that every struct size, alignment,
//! field offset/size and every constant value agrees with this crate.
//!
//! # API summary
//!
//! * **Structs**: one `#[repr(C)]` struct per C struct, named in CamelCase
//!   (`struct vrdma_send_wqe` → [`VrdmaSendWqe`], `struct vrdma_cmd_create_qp` →
//!   [`VrdmaCmdCreateQp`], ...). Fields keep their C names and are plain little-endian integers or
//!   byte arrays (`__le32` → `u32`, `__u8 mac[6]` → `[u8; 6]`); the one exception is the C field
//!   `type`, spelled `type_` in Rust. Every struct derives `Copy, Clone, Debug, PartialEq, Eq, Hash`,
//!   implements `Default` (all zero) and has an all-zero `const ZERO`.
//! * **The WQE union**: `vrdma_send_wqe.wr` is `wr: [u8; 40]` in Rust. Typed views
//!   [`VrdmaWqeRdma`], [`VrdmaWqeAtomic`], [`VrdmaWqeUd`], [`VrdmaWqeReg`] are read with
//!   [`VrdmaSendWqe::rdma`], [`VrdmaSendWqe::atomic`], [`VrdmaSendWqe::ud`], [`VrdmaSendWqe::reg`]
//!   and written with the matching `set_*` methods (which zero the rest of the union).
//! * **Byte conversion**: the [`Abi`] trait (implemented for every ABI struct):
//!   `Abi::SIZE`, `as_bytes(&self) -> &[u8]`, `as_bytes_mut(&mut self) -> &mut [u8]`,
//!   `read_from(&[u8]) -> Option<Self>` (copies the first `SIZE` bytes, `None` if shorter),
//!   `split_from(&[u8]) -> Option<(Self, &[u8])>` (also returns the rest, e.g. a trailing page
//!   list) and `write_to(&self, &mut [u8]) -> Option<()>`. [`read_u64_array`] decodes `__le64`
//!   arrays (page lists).
//! * **Constants**: every `#define` of the header, same name, typed after the field it goes into:
//!   `u8` for `VRDMA_WR_*`, `VRDMA_SEND_*`, `VRDMA_FLUSH_*`, `VRDMA_WC_*` (opcodes, statuses, flags) and
//!   `VRDMA_NETWORK_*`; `u16` for `VRDMA_CMD_*` and the virtqueue indices `VRDMA_VQ_*`; `u64` for
//!   `VRDMA_PAGE_SIZE`; `u32` for everything else (feature *bit numbers* `VIRTIO_RDMA_F_*`
//!   included). [`ABI_CONSTANTS`] lists them all as `(name, value as u64)`.
//! * **Helpers** (mirroring the C macros and the §4 ring rules): [`vrdma_key_index`],
//!   [`vrdma_key_variant`], [`vrdma_make_key`], [`ring_npages`], [`ring_slot`],
//!   [`ring_entry_location`], [`ring_used`], [`sq_max_sge`], [`sq_max_inline`], [`rq_max_sge`],
//!   [`ib_mtu_to_bytes`], [`odp_chunk_size`]; and Rust-only size constants that the header states
//!   only in comments (not in [`ABI_CONSTANTS`]): [`VRDMA_SEND_WQE_HDR_SIZE`] (64),
//!   [`VRDMA_RECV_WQE_HDR_SIZE`] (16), [`VRDMA_SGE_SIZE`] (16), [`VRDMA_CQE_SIZE`] (64),
//!   [`VRDMA_GRH_SIZE`] (40), [`VRDMA_RING_MIN_ENTRY`] (32), [`VRDMA_RING_MAX_ENTRY`] (4096).
//! * **Layout tables** for tests and tools: [`ABI_STRUCTS`] (size, alignment and every field's
//!   offset and size, named as in C; union members appear as `wr.rdma`, `wr.atomic`, ...).
//!
//! # Using the structs with `vm-memory`
//!
//! This crate has no dependencies. `vm_memory::ByteValued` cannot be implemented for these types
//! outside this crate (orphan rule), so wrap them; [`Abi`] guarantees exactly what `ByteValued`
//! needs, so a generic wrapper is sound:
//!
//! ```text
//! #[derive(Copy, Clone, Default)]
//! #[repr(transparent)]
//! pub struct Bv<T: vrdma_spec::Abi>(pub T);
//! // SAFETY: `Abi` types are repr(C), padding-free and valid for every bit pattern.
//! unsafe impl<T: vrdma_spec::Abi> vm_memory::ByteValued for Bv<T> {}
//! ```
//!
//! Only little-endian targets are supported (the ABI is little-endian and the fields are plain
//! integers).

use core::mem::{align_of, offset_of, size_of};

#[cfg(target_endian = "big")]
compile_error!("vrdma-spec: the vrdma ABI is little-endian; big-endian targets are not supported");

// ---------------------------------------------------------------------------------------------
// The byte-conversion trait
// ---------------------------------------------------------------------------------------------

/// Plain-old-data ABI structs that can be viewed as and copied from bytes.
///
/// # Safety
///
/// Implementors must be `#[repr(C)]` structs made only of unsigned integers, arrays of them and
/// other `Abi` structs, with no implicit padding (size == sum of field sizes). Then every byte of
/// a value is initialised and every byte pattern is a valid value, which is what the provided
/// methods rely on. This crate implements it for every struct of `vrdma_abi.h` and checks the
/// "no padding" rule at compile time.
pub unsafe trait Abi: Copy + Default + Send + Sync + 'static {
    /// Size in bytes (`sizeof` of the C struct).
    const SIZE: usize = size_of::<Self>();

    /// The value's bytes, in ABI (little-endian) order.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `self` is a valid reference to `SIZE` bytes; by the trait contract all of them
        // are initialised (no padding). The slice borrows `self`, so it cannot outlive it.
        unsafe { core::slice::from_raw_parts((self as *const Self).cast::<u8>(), Self::SIZE) }
    }

    /// The value's bytes, mutable. Any bytes written form a valid value.
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, and by the trait contract every byte pattern is a valid
        // value, so arbitrary writes through the slice cannot create an invalid `Self`. The
        // slice mutably borrows `self`, so there is no aliasing.
        unsafe { core::slice::from_raw_parts_mut((self as *mut Self).cast::<u8>(), Self::SIZE) }
    }

    /// Copies a value out of the first `SIZE` bytes of `bytes` (any alignment).
    /// Returns `None` if `bytes` is shorter than `SIZE`; extra bytes are ignored.
    fn read_from(bytes: &[u8]) -> Option<Self> {
        let src = bytes.get(..Self::SIZE)?;
        let mut v = Self::default();
        v.as_bytes_mut().copy_from_slice(src);
        Some(v)
    }

    /// Like [`Abi::read_from`], and also returns the bytes after the value.
    fn split_from(bytes: &[u8]) -> Option<(Self, &[u8])> {
        let v = Self::read_from(bytes)?;
        Some((v, bytes.get(Self::SIZE..)?))
    }

    /// Copies the value into the first `SIZE` bytes of `out`; `None` if `out` is too short.
    fn write_to(&self, out: &mut [u8]) -> Option<()> {
        out.get_mut(..Self::SIZE)?.copy_from_slice(self.as_bytes());
        Some(())
    }
}

/// Decodes `count` little-endian `u64`s (a page list) from the start of `bytes`.
/// Returns `None` if `bytes` holds fewer than `count * 8` bytes.
pub fn read_u64_array(bytes: &[u8], count: usize) -> Option<Vec<u64>> {
    let len = count.checked_mul(8)?;
    let src = bytes.get(..len)?;
    Some(
        src.chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                u64::from_le_bytes(b)
            })
            .collect(),
    )
}

/// All-zero constant values, used to build `const ZERO` for every struct.
trait Zeroed {
    const ZERO: Self;
}

macro_rules! zeroed_ints {
    ($($t:ty),*) => { $(impl Zeroed for $t { const ZERO: Self = 0; })* };
}
zeroed_ints!(u8, u16, u32, u64);

impl<T: Zeroed + Copy, const N: usize> Zeroed for [T; N] {
    const ZERO: Self = [T::ZERO; N];
}

// ---------------------------------------------------------------------------------------------
// Layout tables (used by the ABI agreement test)
// ---------------------------------------------------------------------------------------------

/// One field of an ABI struct: C name (union members as `union.member`), offset and size.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AbiField {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
}

/// One ABI struct: C name (`vrdma_cqe`), Rust name (`VrdmaCqe`), size, alignment, fields.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AbiStruct {
    pub c_name: &'static str,
    pub rust_name: &'static str,
    pub size: usize,
    pub align: usize,
    pub fields: &'static [AbiField],
}

/// The C spelling of a Rust field name: a trailing `_` (used for `type`) is dropped.
const fn c_field_name(rust: &'static str) -> &'static str {
    let b = rust.as_bytes();
    if !b.is_empty() && b[b.len() - 1] == b'_' {
        let (head, _) = b.split_at(b.len() - 1);
        match core::str::from_utf8(head) {
            Ok(s) => s,
            Err(_) => rust,
        }
    } else {
        rust
    }
}

macro_rules! abi_structs {
    ($(
        $(#[$meta:meta])*
        $c_name:literal, size $size:literal:
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty, )*
        }
        $( union $ufield:ident { $( $umember:ident : $uty:ty ),* $(,)? } )?
    )*) => {
        $(
            $(#[$meta])*
            #[doc = concat!("\n\nC: `struct ", $c_name, "`, ", stringify!($size), " bytes.")]
            #[repr(C)]
            #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
            pub struct $name {
                $( $(#[$fmeta])* pub $field: $ty, )*
            }

            impl $name {
                /// The all-zero value.
                pub const ZERO: Self = Self { $( $field: <$ty as Zeroed>::ZERO, )* };
            }

            impl Zeroed for $name {
                const ZERO: Self = <$name>::ZERO;
            }

            impl Default for $name {
                fn default() -> Self {
                    Self::ZERO
                }
            }

            const _: () = assert!(size_of::<$name>() == $size, "size differs from the C header");
            const _: () = assert!(
                size_of::<$name>() == 0 $( + size_of::<$ty>() )*,
                "implicit padding in an ABI struct"
            );
            $($( const _: () = assert!(size_of::<$uty>() <= size_of::<[u8; 40]>()); )*)?

            // SAFETY: `$name` is `#[repr(C)]` and consists only of unsigned integers, arrays of
            // unsigned integers and other `Abi` structs; the const assertion above proves that
            // its size equals the sum of its field sizes, so it has no padding. Hence all bytes
            // are initialised and every bit pattern is a valid value.
            unsafe impl Abi for $name {}
        )*

        /// Layout of every ABI struct, in header order.
        pub const ABI_STRUCTS: &[AbiStruct] = &[
            $(
                AbiStruct {
                    c_name: $c_name,
                    rust_name: stringify!($name),
                    size: size_of::<$name>(),
                    align: align_of::<$name>(),
                    fields: &[
                        $( AbiField {
                            name: c_field_name(stringify!($field)),
                            offset: offset_of!($name, $field),
                            size: size_of::<$ty>(),
                        }, )*
                        $($( AbiField {
                            name: concat!(stringify!($ufield), ".", stringify!($umember)),
                            offset: offset_of!($name, $ufield),
                            size: size_of::<$uty>(),
                        }, )*)?
                    ],
                },
            )*
        ];
    };
}

macro_rules! abi_consts {
    ($( $(#[$meta:meta])* $name:ident : $ty:ty = $val:expr; )*) => {
        $( $(#[$meta])* pub const $name: $ty = $val; )*

        /// Every constant of the header as `(C name, value)`, in header order.
        pub const ABI_CONSTANTS: &[(&str, u64)] = &[ $( (stringify!($name), $name as u64), )* ];
    };
}

// ---------------------------------------------------------------------------------------------
// Constants (header order)
// ---------------------------------------------------------------------------------------------

abi_consts! {
    /// §1 virtio device ID.
    VIRTIO_ID_RDMA: u32 = 42;
    VRDMA_ABI_VERSION: u32 = 1;

    /// §2 Feature bit numbers (device-specific bits 0..23): explicit ODP MRs.
    VIRTIO_RDMA_F_ODP: u32 = 0;
    /// Implicit (whole address space) ODP MRs.
    VIRTIO_RDMA_F_ODP_IMPLICIT: u32 = 1;
    /// Integrated Ethernet port on virtqueues 4 and 5.
    VIRTIO_RDMA_F_ETH: u32 = 2;

    /// §3 Virtqueue indices.
    VRDMA_VQ_CONTROL: u16 = 0;
    VRDMA_VQ_EVENT: u16 = 1;
    VRDMA_VQ_DOORBELL: u16 = 2;
    VRDMA_VQ_PAGEREQ: u16 = 3;
    VRDMA_VQ_ETH_RX: u16 = 4;
    VRDMA_VQ_ETH_TX: u16 = 5;
    VRDMA_NUM_VQS: u16 = 6;

    /// §2.2 `atomic_cap` values.
    /// BTH destination QP of multicast datagrams (IBTA 10.5, §15.8).
    VRDMA_MCAST_QPN: u32 = 0xff_ffff;
    VRDMA_ATOMIC_NONE: u32 = 0;
    VRDMA_ATOMIC_HCA: u32 = 1;
    VRDMA_ATOMIC_GLOB: u32 = 2;

    /// §2.2 `odp_general_caps` bits.
    VRDMA_ODP_SUPPORT: u32 = 1 << 0;
    VRDMA_ODP_SUPPORT_IMPLICIT: u32 = 1 << 1;

    /// §2.2 per-transport ODP caps (`odp_rc_caps`, `odp_uc_caps`, `odp_ud_caps`).
    VRDMA_ODP_SEND: u32 = 1 << 0;
    VRDMA_ODP_RECV: u32 = 1 << 1;
    VRDMA_ODP_WRITE: u32 = 1 << 2;
    VRDMA_ODP_READ: u32 = 1 << 3;
    VRDMA_ODP_ATOMIC: u32 = 1 << 4;
    VRDMA_ODP_SRQ_RECV: u32 = 1 << 5;
    /// §2.2 `odp_chunk_shift`: the range a device may offer.
    VRDMA_ODP_CHUNK_SHIFT_MIN: u32 = 12;
    VRDMA_ODP_CHUNK_SHIFT_MAX: u32 = 30;

    /// §2.2 `device_caps` bits: IBTA 1.5 remote operations the device executes.
    VRDMA_DEVCAP_ATOMIC_WRITE: u32 = 1 << 0;
    VRDMA_DEVCAP_FLUSH_GLOBAL: u32 = 1 << 1;
    /// §11.7 MODIFY_SRQ with `VRDMA_SRQ_MAX_WR` (resize).
    VRDMA_DEVCAP_SRQ_RESIZE: u32 = 1 << 2;
    /// §5.5 MODIFY_CQ (CQ moderation).
    VRDMA_DEVCAP_CQ_MODERATION: u32 = 1 << 3;
    /// §13.7 XRC: ALLOC_XRCD / DEALLOC_XRCD, XRC SRQs, XRC_INI / XRC_TGT QPs.
    VRDMA_DEVCAP_XRC: u32 = 1 << 4;

    /// §2.2 `port_state` values.
    VRDMA_PORT_DOWN: u32 = 1;
    VRDMA_PORT_ACTIVE: u32 = 4;

    /// §4 Ring page size.
    VRDMA_PAGE_SHIFT: u32 = 12;
    VRDMA_PAGE_SIZE: u64 = 1 << VRDMA_PAGE_SHIFT;

    /// §5.3 `vrdma_ring_ctrl.cq_arm` values.
    VRDMA_CQ_ARM_NONE: u32 = 0;
    VRDMA_CQ_ARM_NEXT: u32 = 1;
    VRDMA_CQ_ARM_SOLICITED: u32 = 2;

    /// §4 `vrdma_ring_ctrl.error` values.
    VRDMA_RING_ERR_NONE: u32 = 0;
    VRDMA_RING_ERR_OVERFLOW: u32 = 1;
    VRDMA_RING_ERR_INDEX: u32 = 2;
    VRDMA_RING_ERR_ACCESS: u32 = 3;

    /// §6.1 Send opcodes (`vrdma_send_wqe.opcode`).
    VRDMA_WR_RDMA_WRITE: u8 = 0;
    VRDMA_WR_RDMA_WRITE_WITH_IMM: u8 = 1;
    VRDMA_WR_SEND: u8 = 2;
    VRDMA_WR_SEND_WITH_IMM: u8 = 3;
    VRDMA_WR_RDMA_READ: u8 = 4;
    VRDMA_WR_ATOMIC_CMP_AND_SWP: u8 = 5;
    VRDMA_WR_ATOMIC_FETCH_AND_ADD: u8 = 6;
    VRDMA_WR_LOCAL_INV: u8 = 7;
    VRDMA_WR_REG_MR: u8 = 8;
    VRDMA_WR_SEND_WITH_INV: u8 = 9;
    VRDMA_WR_ATOMIC_WRITE: u8 = 10;
    VRDMA_WR_FLUSH: u8 = 11;
    /// §12.8 memory window bind (RC, UC; `max_mw` > 0).
    VRDMA_WR_BIND_MW: u8 = 12;

    /// §6.1 Send flags (`vrdma_send_wqe.flags`).
    VRDMA_SEND_SIGNALED: u8 = 1 << 0;
    VRDMA_SEND_SOLICITED: u8 = 1 << 1;
    VRDMA_SEND_INLINE: u8 = 1 << 2;
    VRDMA_SEND_FENCE: u8 = 1 << 3;

    /// §6.1 FLUSH placement types (`wr.flush.placement`) and selectivity levels.
    VRDMA_FLUSH_GLOBAL: u8 = 1 << 0;
    VRDMA_FLUSH_PERSISTENT: u8 = 1 << 1;
    VRDMA_FLUSH_RANGE: u8 = 0;
    VRDMA_FLUSH_MR: u8 = 1;

    /// §7 CQE opcodes (`vrdma_cqe.opcode`).
    VRDMA_WC_SEND: u8 = 0;
    VRDMA_WC_RDMA_WRITE: u8 = 1;
    VRDMA_WC_RDMA_READ: u8 = 2;
    VRDMA_WC_COMP_SWAP: u8 = 3;
    VRDMA_WC_FETCH_ADD: u8 = 4;
    VRDMA_WC_BIND_MW: u8 = 5;
    VRDMA_WC_LOCAL_INV: u8 = 6;
    VRDMA_WC_REG_MR: u8 = 8;
    VRDMA_WC_ATOMIC_WRITE: u8 = 9;
    VRDMA_WC_FLUSH: u8 = 10;
    VRDMA_WC_RECV: u8 = 128;
    VRDMA_WC_RECV_RDMA_WITH_IMM: u8 = 129;

    /// §7 Completion status (`vrdma_cqe.status`), numerically equal to `enum ib_wc_status`.
    VRDMA_WC_SUCCESS: u8 = 0;
    VRDMA_WC_LOC_LEN_ERR: u8 = 1;
    VRDMA_WC_LOC_QP_OP_ERR: u8 = 2;
    VRDMA_WC_LOC_EEC_OP_ERR: u8 = 3;
    VRDMA_WC_LOC_PROT_ERR: u8 = 4;
    VRDMA_WC_WR_FLUSH_ERR: u8 = 5;
    VRDMA_WC_MW_BIND_ERR: u8 = 6;
    VRDMA_WC_BAD_RESP_ERR: u8 = 7;
    VRDMA_WC_LOC_ACCESS_ERR: u8 = 8;
    VRDMA_WC_REM_INV_REQ_ERR: u8 = 9;
    VRDMA_WC_REM_ACCESS_ERR: u8 = 10;
    VRDMA_WC_REM_OP_ERR: u8 = 11;
    VRDMA_WC_RETRY_EXC_ERR: u8 = 12;
    VRDMA_WC_RNR_RETRY_EXC_ERR: u8 = 13;
    VRDMA_WC_LOC_RDD_VIOL_ERR: u8 = 14;
    VRDMA_WC_REM_INV_RD_REQ_ERR: u8 = 15;
    VRDMA_WC_REM_ABORT_ERR: u8 = 16;
    VRDMA_WC_INV_EECN_ERR: u8 = 17;
    VRDMA_WC_INV_EEC_STATE_ERR: u8 = 18;
    VRDMA_WC_FATAL_ERR: u8 = 19;
    VRDMA_WC_RESP_TIMEOUT_ERR: u8 = 20;
    VRDMA_WC_GENERAL_ERR: u8 = 21;

    /// §7 CQE flags (`vrdma_cqe.flags`).
    VRDMA_WC_F_GRH: u8 = 1 << 0;
    VRDMA_WC_F_IMM: u8 = 1 << 1;
    VRDMA_WC_F_INV: u8 = 1 << 2;

    /// §7 `vrdma_cqe.network_hdr_type` (same as `enum rdma_network_type`).
    VRDMA_NETWORK_ROCE_V1: u8 = 1;
    VRDMA_NETWORK_IPV4: u8 = 2;
    VRDMA_NETWORK_IPV6: u8 = 3;

    /// §8 Doorbell record types (`vrdma_doorbell.type_`).
    VRDMA_DB_SQ: u32 = 1;
    VRDMA_DB_RQ: u32 = 2;
    VRDMA_DB_SRQ: u32 = 3;
    VRDMA_DB_CQ_ARM: u32 = 4;

    /// §9 Event types (`vrdma_event.type_`).
    VRDMA_EV_CQ_COMP: u32 = 1;
    VRDMA_EV_CQ_ERR: u32 = 2;
    VRDMA_EV_QP_FATAL: u32 = 3;
    VRDMA_EV_QP_REQ_ERR: u32 = 4;
    VRDMA_EV_QP_ACCESS_ERR: u32 = 5;
    VRDMA_EV_COMM_EST: u32 = 6;
    VRDMA_EV_SQ_DRAINED: u32 = 7;
    VRDMA_EV_QP_LAST_WQE_REACHED: u32 = 8;
    VRDMA_EV_SRQ_LIMIT_REACHED: u32 = 9;
    VRDMA_EV_SRQ_ERR: u32 = 10;
    VRDMA_EV_PORT_ACTIVE: u32 = 11;
    VRDMA_EV_PORT_ERR: u32 = 12;
    VRDMA_EV_DEVICE_FATAL: u32 = 13;

    /// §10 Page request types (`vrdma_page_req.type_`).
    VRDMA_PAGEREQ_FAULT: u32 = 1;
    VRDMA_PAGEREQ_RECLAIM: u32 = 2;
    /// §10 `vrdma_page_req.flags`.
    VRDMA_PAGEREQ_F_WRITE: u32 = 1 << 0;

    /// §11 Control command opcodes (`vrdma_cmd_hdr.opcode`).
    VRDMA_CMD_QUERY_DEVICE: u16 = 1;
    VRDMA_CMD_QUERY_PORT: u16 = 2;
    VRDMA_CMD_ADD_GID: u16 = 3;
    VRDMA_CMD_DEL_GID: u16 = 4;
    VRDMA_CMD_CREATE_PD: u16 = 5;
    VRDMA_CMD_DESTROY_PD: u16 = 6;
    VRDMA_CMD_CREATE_CQ: u16 = 7;
    VRDMA_CMD_DESTROY_CQ: u16 = 8;
    VRDMA_CMD_RESIZE_CQ: u16 = 9;
    VRDMA_CMD_CREATE_QP: u16 = 10;
    VRDMA_CMD_MODIFY_QP: u16 = 11;
    VRDMA_CMD_QUERY_QP: u16 = 12;
    VRDMA_CMD_DESTROY_QP: u16 = 13;
    VRDMA_CMD_CREATE_SRQ: u16 = 14;
    VRDMA_CMD_MODIFY_SRQ: u16 = 15;
    VRDMA_CMD_QUERY_SRQ: u16 = 16;
    VRDMA_CMD_DESTROY_SRQ: u16 = 17;
    VRDMA_CMD_CREATE_AH: u16 = 18;
    VRDMA_CMD_DESTROY_AH: u16 = 19;
    VRDMA_CMD_REG_MR: u16 = 20;
    VRDMA_CMD_REG_DMA_MR: u16 = 21;
    VRDMA_CMD_ALLOC_FAST_REG_MR: u16 = 22;
    VRDMA_CMD_REG_ODP_MR: u16 = 23;
    VRDMA_CMD_REG_IMPLICIT_MR: u16 = 24;
    VRDMA_CMD_DEREG_MR: u16 = 25;
    VRDMA_CMD_ADVISE_MR: u16 = 26;
    VRDMA_CMD_ODP_PAGE_RESP: u16 = 27;
    VRDMA_CMD_ODP_INVALIDATE: u16 = 28;
    VRDMA_CMD_REREG_MR: u16 = 29;
    VRDMA_CMD_ALLOC_MW: u16 = 30;
    VRDMA_CMD_DEALLOC_MW: u16 = 31;
    /// §15.8 UD QP joins / leaves a multicast GID.
    VRDMA_CMD_ATTACH_MCAST: u16 = 40;
    VRDMA_CMD_DETACH_MCAST: u16 = 41;
    VRDMA_CMD_QUERY_STATS: u16 = 32;
    VRDMA_CMD_MODIFY_CQ: u16 = 33;
    /// §13.7 XRC domains.
    VRDMA_CMD_ALLOC_XRCD: u16 = 34;
    VRDMA_CMD_DEALLOC_XRCD: u16 = 35;

    /// §11.1 Largest trailing page list of one command, in `__le64` entries (64 MiB).
    VRDMA_CMD_MAX_PAGES: u32 = 1 << 23;
    /// §11.1 Largest readable part of a control chain: 4 KiB for the command header and request,
    /// then the largest page list.
    VRDMA_CMD_MAX_LEN: u32 = 4096 + 8 * VRDMA_CMD_MAX_PAGES;
    /// §11.1 Most descriptors in one control chain (indirect table entries included): the
    /// largest page list split at every 4 KiB page (16385 pages) plus the header, request and
    /// response descriptors, rounded up.
    VRDMA_CMD_MAX_DESCS: u32 = 16448;

    /// §11.1 Command status (`vrdma_cmd_resp_hdr.status`).
    VRDMA_STATUS_OK: u32 = 0;
    VRDMA_STATUS_INVALID: u32 = 1;
    VRDMA_STATUS_NOT_SUPPORTED: u32 = 2;
    VRDMA_STATUS_NO_RESOURCES: u32 = 3;
    VRDMA_STATUS_NOT_FOUND: u32 = 4;
    VRDMA_STATUS_BUSY: u32 = 5;
    VRDMA_STATUS_BAD_STATE: u32 = 6;
    VRDMA_STATUS_ACCESS: u32 = 7;
    VRDMA_STATUS_BAD_ADDRESS: u32 = 8;
    VRDMA_STATUS_NEEDS_RESET: u32 = 9;

    /// §11 GID types (`vrdma_cmd_gid.type_`).
    VRDMA_GID_TYPE_ROCE_V1: u32 = 1;
    VRDMA_GID_TYPE_ROCE_V2: u32 = 2;

    /// §13 QP types (`vrdma_cmd_create_qp.qp_type`).
    VRDMA_QPT_RC: u32 = 2;
    VRDMA_QPT_UC: u32 = 3;
    VRDMA_QPT_UD: u32 = 4;
    VRDMA_QPT_GSI: u32 = 1;
    /// §13.7 XRC initiator (send queue only) and target (no rings) QPs; IB values.
    VRDMA_QPT_XRC_INI: u32 = 9;
    VRDMA_QPT_XRC_TGT: u32 = 10;

    /// §11.7 SRQ types (`vrdma_cmd_create_srq.srq_type`, same as `enum ib_srq_type`).
    VRDMA_SRQT_BASIC: u8 = 0;
    VRDMA_SRQT_XRC: u8 = 1;

    /// `vrdma_cmd_create_qp.srqn` when the QP has no SRQ.
    VRDMA_NO_SRQ: u32 = 0xffff_ffff;

    /// §13 QP states (same as `enum ib_qp_state`).
    VRDMA_QPS_RESET: u32 = 0;
    VRDMA_QPS_INIT: u32 = 1;
    VRDMA_QPS_RTR: u32 = 2;
    VRDMA_QPS_RTS: u32 = 3;
    VRDMA_QPS_SQD: u32 = 4;
    VRDMA_QPS_SQE: u32 = 5;
    VRDMA_QPS_ERR: u32 = 6;

    /// §13 MODIFY_QP attribute mask bits (same as `enum ib_qp_attr_mask`).
    VRDMA_QP_STATE: u32 = 1 << 0;
    VRDMA_QP_CUR_STATE: u32 = 1 << 1;
    VRDMA_QP_EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    VRDMA_QP_ACCESS_FLAGS: u32 = 1 << 3;
    VRDMA_QP_PKEY_INDEX: u32 = 1 << 4;
    VRDMA_QP_PORT: u32 = 1 << 5;
    VRDMA_QP_QKEY: u32 = 1 << 6;
    VRDMA_QP_AV: u32 = 1 << 7;
    VRDMA_QP_PATH_MTU: u32 = 1 << 8;
    VRDMA_QP_TIMEOUT: u32 = 1 << 9;
    VRDMA_QP_RETRY_CNT: u32 = 1 << 10;
    VRDMA_QP_RNR_RETRY: u32 = 1 << 11;
    VRDMA_QP_RQ_PSN: u32 = 1 << 12;
    VRDMA_QP_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    VRDMA_QP_ALT_PATH: u32 = 1 << 14;
    VRDMA_QP_MIN_RNR_TIMER: u32 = 1 << 15;
    VRDMA_QP_SQ_PSN: u32 = 1 << 16;
    VRDMA_QP_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    VRDMA_QP_PATH_MIG_STATE: u32 = 1 << 18;
    VRDMA_QP_CAP: u32 = 1 << 19;
    VRDMA_QP_DEST_QPN: u32 = 1 << 20;

    /// §12 Access flags (same as `enum ib_access_flags`, low bits).
    VRDMA_ACCESS_LOCAL_WRITE: u32 = 1 << 0;
    VRDMA_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
    VRDMA_ACCESS_REMOTE_READ: u32 = 1 << 2;
    VRDMA_ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;
    VRDMA_ACCESS_MW_BIND: u32 = 1 << 4;
    VRDMA_ACCESS_ZERO_BASED: u32 = 1 << 5;
    VRDMA_ACCESS_ON_DEMAND: u32 = 1 << 6;
    VRDMA_ACCESS_FLUSH_GLOBAL: u32 = 1 << 8;
    VRDMA_ACCESS_FLUSH_PERSISTENT: u32 = 1 << 9;
    /// §13.4 rule 4: the bits `vrdma_qp_attr.qp_access_flags` may hold.
    VRDMA_QP_ACCESS_ALLOWED: u32 = VRDMA_ACCESS_LOCAL_WRITE
        | VRDMA_ACCESS_REMOTE_WRITE
        | VRDMA_ACCESS_REMOTE_READ
        | VRDMA_ACCESS_REMOTE_ATOMIC
        | VRDMA_ACCESS_FLUSH_GLOBAL
        | VRDMA_ACCESS_FLUSH_PERSISTENT;

    /// §11 MODIFY_SRQ attribute mask bits.
    VRDMA_SRQ_MAX_WR: u32 = 1 << 0;
    VRDMA_SRQ_LIMIT: u32 = 1 << 1;

    /// §12.8 ALLOC_MW window types (`vrdma_cmd_alloc_mw.type_`), equal to `enum ib_mw_type`.
    VRDMA_MW_TYPE_1: u32 = 1;
    VRDMA_MW_TYPE_2: u32 = 2;

    /// §11 ADVISE_MR advice values.
    VRDMA_ADVISE_PREFETCH: u32 = 0;
    VRDMA_ADVISE_PREFETCH_WRITE: u32 = 1;
    VRDMA_ADVISE_PREFETCH_NO_FAULT: u32 = 2;
    /// ADVISE_MR flag: complete only when the range is resident.
    VRDMA_ADVISE_F_FLUSH: u32 = 1 << 0;

    /// §10 ODP_PAGE_RESP flags.
    VRDMA_ODP_RESP_F_WRITABLE: u32 = 1 << 0;

    /// Special QP numbers.
    VRDMA_GSI_QPN: u32 = 1;
    VRDMA_FIRST_QPN: u32 = 16;
    /// §13.6 the GSI QP's Q_Key (IBTA 13.4.6.1).
    VRDMA_GSI_QKEY: u32 = 0x8001_0000;
    /// §11.5, §7 `vrdma_av.vlan_id` / `vrdma_cqe.vlan_id`: the frame is untagged.
    VRDMA_VLAN_NONE: u16 = 0xffff;
}

// ---------------------------------------------------------------------------------------------
// Structs (header order)
// ---------------------------------------------------------------------------------------------

abi_structs! {
    /// §2.2 Device configuration space (read-only to the driver); also the QUERY_DEVICE response.
    "vrdma_config", size 256:
    pub struct VrdmaConfig {
        /// Integrated Ethernet port MAC.
        pub mac: [u8; 6],
        /// Ethernet (IP) MTU, e.g. 1500.
        pub mtu: u16,
        pub max_pd: u32,
        pub max_qp: u32,
        pub max_cq: u32,
        pub max_srq: u32,
        pub max_mr: u32,
        pub max_ah: u32,
        /// 0: memory windows not supported.
        pub max_mw: u32,
        /// Per SQ/RQ depth limit.
        pub max_qp_wr: u32,
        pub max_srq_wr: u32,
        pub max_cqe: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_srq_sge: u32,
        pub max_inline_data: u32,
        /// `max_rd_atomic` per QP.
        pub max_qp_rd_atom: u32,
        /// `max_dest_rd_atomic` per QP.
        pub max_qp_init_rd_atom: u32,
        pub max_fast_reg_page_list_len: u32,
        /// GID table entries.
        pub max_gid: u32,
        pub max_msg_sz: u32,
        /// `VRDMA_ATOMIC_*`.
        pub atomic_cap: u32,
        /// `VRDMA_ODP_SUPPORT*`.
        pub odp_general_caps: u32,
        /// `VRDMA_ODP_{SEND,...}`.
        pub odp_rc_caps: u32,
        pub odp_uc_caps: u32,
        pub odp_ud_caps: u32,
        /// log2 of the ODP chunk, 21 = 2 MiB.
        pub odp_chunk_shift: u32,
        /// `VRDMA_PORT_*`.
        pub port_state: u32,
        pub vendor_id: u32,
        pub vendor_part_id: u32,
        pub hw_ver: u32,
        /// `VRDMA_DEVCAP_*`.
        pub device_caps: u32,
        pub max_mr_size: u64,
        /// Bitmap of supported MR page sizes.
        pub page_size_cap: u64,
        pub node_guid: u64,
        pub fw_ver: u64,
        /// 0: UD multicast not supported (§15.8).
        pub max_mcast_grp: u32,
        /// QPs attached to one multicast group.
        pub max_mcast_qp_attach: u32,
        pub reserved: [u8; 88],
    }

    /// §4 Page 0 of every ring.
    "vrdma_ring_ctrl", size 192:
    pub struct VrdmaRingCtrl {
        /// SQ/RQ/SRQ: driver writes; CQ: device writes.
        pub producer: u32,
        pub pad0: [u8; 60],
        /// SQ/RQ/SRQ: device writes; CQ: driver writes.
        pub consumer: u32,
        pub pad1: [u8; 60],
        /// CQ only: `VRDMA_CQ_ARM_*` (§5.3).
        pub cq_arm: u32,
        /// Device sets `VRDMA_RING_ERR_*` and stops using the ring.
        pub error: u32,
        pub pad2: [u8; 56],
    }

    /// §6 Scatter/gather element.
    "vrdma_sge", size 16:
    pub struct VrdmaSge {
        pub addr: u64,
        pub length: u32,
        pub lkey: u32,
    }

    /// §6.1 `wr.rdma`: RDMA WRITE / READ.
    "vrdma_wqe_rdma", size 16:
    pub struct VrdmaWqeRdma {
        pub remote_addr: u64,
        pub rkey: u32,
        pub reserved: u32,
    }

    /// §6.1 `wr.atomic`: compare-and-swap / fetch-and-add.
    "vrdma_wqe_atomic", size 32:
    pub struct VrdmaWqeAtomic {
        pub remote_addr: u64,
        pub rkey: u32,
        pub reserved: u32,
        pub compare_add: u64,
        pub swap: u64,
    }

    /// §6.1 `wr.atomic_write`: ATOMIC WRITE; `data` is stored byte for byte (memory order).
    "vrdma_wqe_atomic_write", size 24:
    pub struct VrdmaWqeAtomicWrite {
        /// 8-byte aligned.
        pub remote_addr: u64,
        pub rkey: u32,
        pub reserved: u32,
        pub data: [u8; 8],
    }

    /// §6.1 `wr.flush`: FLUSH.
    "vrdma_wqe_flush", size 24:
    pub struct VrdmaWqeFlush {
        pub remote_addr: u64,
        pub rkey: u32,
        /// `VRDMA_FLUSH_GLOBAL` / `VRDMA_FLUSH_PERSISTENT`.
        pub placement: u8,
        /// `VRDMA_FLUSH_RANGE` / `VRDMA_FLUSH_MR`.
        pub selectivity: u8,
        pub reserved: [u8; 2],
        /// `VRDMA_FLUSH_RANGE` only.
        pub length: u64,
    }

    /// §6.1 `wr.ud`: UD/GSI destination.
    "vrdma_wqe_ud", size 16:
    pub struct VrdmaWqeUd {
        /// From `VRDMA_CMD_CREATE_AH`.
        pub ah_index: u32,
        pub remote_qpn: u32,
        pub remote_qkey: u32,
        pub reserved: u32,
    }

    /// §6.1 `wr.reg`: fast registration (REG_MR WQE). The page list is an array of `__le64`
    /// guest physical addresses at `page_list_addr`, `page_list_len` entries.
    "vrdma_wqe_reg", size 40:
    pub struct VrdmaWqeReg {
        pub iova: u64,
        pub length: u64,
        /// New lkey/rkey; its index bits must match the MR's.
        pub key: u32,
        /// `VRDMA_ACCESS_*`.
        pub access: u32,
        pub page_list_len: u32,
        pub page_shift: u32,
        pub page_list_addr: u64,
    }

    /// §6.1 / §12.8 `wr.bind_mw`: memory window bind (BIND_MW WQE), both window types.
    "vrdma_wqe_bind_mw", size 40:
    pub struct VrdmaWqeBindMw {
        /// First byte of the window, in the MR's iova space.
        pub addr: u64,
        /// 0: unbind (type 1 only).
        pub length: u64,
        /// The window's current rkey.
        pub mw_key: u32,
        /// Its rkey after the bind; the index bits must match `mw_key`'s.
        pub new_key: u32,
        /// lkey of the MR to bind to.
        pub mr_key: u32,
        /// `VRDMA_ACCESS_REMOTE_*`, `VRDMA_ACCESS_ZERO_BASED`.
        pub access: u32,
        pub reserved: [u32; 2],
    }

    /// §6.1 Send WQE header: then `num_sge` [`VrdmaSge`]s, or `inline_len` bytes of inline data
    /// when `VRDMA_SEND_INLINE` is set. Use [`VrdmaSendWqe::rdma`] & co. for the `wr` union.
    "vrdma_send_wqe", size 64:
    pub struct VrdmaSendWqe {
        pub wr_id: u64,
        /// `VRDMA_WR_*`.
        pub opcode: u8,
        /// `VRDMA_SEND_*`.
        pub flags: u8,
        pub num_sge: u8,
        pub reserved0: u8,
        /// imm_data (in wire byte order) or the rkey to invalidate.
        pub ex: u32,
        pub inline_len: u32,
        /// XRC_INI QPs: the remote XRC SRQ number sent in the XRCETH (§13.7); else 0.
        pub xrc_srqn: u32,
        /// The C union `wr { rdma, atomic, atomic_write, flush, ud, reg, bind_mw, raw[40] }`.
        pub wr: [u8; 40],
    }
    union wr {
        rdma: VrdmaWqeRdma,
        atomic: VrdmaWqeAtomic,
        atomic_write: VrdmaWqeAtomicWrite,
        flush: VrdmaWqeFlush,
        ud: VrdmaWqeUd,
        reg: VrdmaWqeReg,
        bind_mw: VrdmaWqeBindMw,
        raw: [u8; 40],
    }

    /// §6.2 Receive WQE header: then `num_sge` [`VrdmaSge`]s.
    "vrdma_recv_wqe", size 16:
    pub struct VrdmaRecvWqe {
        pub wr_id: u64,
        pub num_sge: u32,
        pub reserved: u32,
    }

    /// §7 Completion queue entry.
    "vrdma_cqe", size 64:
    pub struct VrdmaCqe {
        pub wr_id: u64,
        pub qpn: u32,
        /// `VRDMA_WC_*` opcode.
        pub opcode: u8,
        /// `VRDMA_WC_*` status.
        pub status: u8,
        /// `VRDMA_WC_F_*`.
        pub flags: u8,
        /// `VRDMA_NETWORK_*`, UD/GSI receives.
        pub network_hdr_type: u8,
        pub byte_len: u32,
        /// imm_data (wire order) or the invalidated rkey.
        pub ex: u32,
        pub src_qp: u32,
        pub pkey_index: u16,
        pub sl: u8,
        pub reserved0: u8,
        pub vendor_err: u32,
        pub smac: [u8; 6],
        pub vlan_id: u16,
        pub reserved1: [u8; 20],
    }

    /// §8 Doorbell record (doorbell virtqueue).
    "vrdma_doorbell", size 8:
    pub struct VrdmaDoorbell {
        /// `VRDMA_DB_*` (C field `type`).
        pub type_: u32,
        /// qpn, srqn or cqn.
        pub id: u32,
    }

    /// §9 Event record (event virtqueue).
    "vrdma_event", size 16:
    pub struct VrdmaEvent {
        /// `VRDMA_EV_*` (C field `type`).
        pub type_: u32,
        pub id: u32,
        /// Event-specific, e.g. a WC status.
        pub info: u32,
        pub reserved: u32,
    }

    /// §10 ODP page request (pagereq virtqueue, device → driver).
    "vrdma_page_req", size 32:
    pub struct VrdmaPageReq {
        /// `VRDMA_PAGEREQ_*` (C field `type`).
        pub type_: u32,
        /// Echoed by `VRDMA_CMD_ODP_PAGE_RESP`.
        pub req_id: u32,
        /// lkey of the MR.
        pub mr_key: u32,
        /// `VRDMA_PAGEREQ_F_*`.
        pub flags: u32,
        pub iova: u64,
        pub length: u64,
    }

    /// §11 Command header (start of the device-readable part).
    "vrdma_cmd_hdr", size 8:
    pub struct VrdmaCmdHdr {
        /// `VRDMA_CMD_*`.
        pub opcode: u16,
        /// Must be 0.
        pub flags: u16,
        pub reserved: u32,
    }

    /// §11 Response header (start of the device-writable part).
    "vrdma_cmd_resp_hdr", size 8:
    pub struct VrdmaCmdRespHdr {
        /// `VRDMA_STATUS_*`.
        pub status: u32,
        pub reserved: u32,
    }

    /// QUERY_PORT request.
    "vrdma_cmd_query_port", size 8:
    pub struct VrdmaCmdQueryPort {
        /// Must be 1.
        pub port: u32,
        pub reserved: u32,
    }

    /// QUERY_PORT response.
    "vrdma_resp_query_port", size 32:
    pub struct VrdmaRespQueryPort {
        /// `VRDMA_PORT_*`.
        pub state: u32,
        /// IB MTU enum 1..5.
        pub max_mtu: u32,
        pub active_mtu: u32,
        pub gid_tbl_len: u32,
        pub max_msg_sz: u32,
        /// 5 = LinkUp, 3 = Disabled.
        pub phys_state: u32,
        /// IB_SPEED_*.
        pub active_speed: u32,
        /// IB_WIDTH_*.
        pub active_width: u32,
    }

    /// ADD_GID / DEL_GID request.
    "vrdma_cmd_gid", size 24:
    pub struct VrdmaCmdGid {
        pub index: u32,
        /// `VRDMA_GID_TYPE_*`, ignored by DEL_GID (C field `type`).
        pub type_: u32,
        pub gid: [u8; 16],
    }

    /// ATTACH_MCAST / DETACH_MCAST request (§15.8).
    "vrdma_cmd_mcast", size 24:
    pub struct VrdmaCmdMcast {
        pub qpn: u32,
        pub reserved: u32,
        /// Multicast GID (IPv4-mapped 224.0.0.0/4 or IPv6 ff00::/8).
        pub gid: [u8; 16],
    }

    /// Single-handle request/response (pdn, cqn, qpn, srqn, AH index or lkey).
    "vrdma_handle", size 8:
    pub struct VrdmaHandle {
        pub handle: u32,
        pub reserved: u32,
    }

    /// CREATE_CQ / RESIZE_CQ request; a `__le64` page list follows.
    "vrdma_cmd_create_cq", size 16:
    pub struct VrdmaCmdCreateCq {
        /// RESIZE_CQ only; 0 for CREATE_CQ.
        pub cqn: u32,
        /// Entries, power of two.
        pub depth: u32,
        /// Trailing page list length.
        pub npages: u32,
        pub reserved: u32,
    }

    /// CREATE_QP request; page list follows: SQ pages then RQ pages (no RQ with an SRQ).
    "vrdma_cmd_create_qp", size 56:
    pub struct VrdmaCmdCreateQp {
        pub pdn: u32,
        /// `VRDMA_QPT_*`.
        pub qp_type: u32,
        pub send_cqn: u32,
        pub recv_cqn: u32,
        /// `VRDMA_NO_SRQ` when none.
        pub srqn: u32,
        /// Power of two.
        pub sq_depth: u32,
        /// Power of two, 0 with an SRQ.
        pub rq_depth: u32,
        /// log2 of the SQ slot size.
        pub sq_wqe_shift: u8,
        /// log2 of the RQ slot size.
        pub rq_wqe_shift: u8,
        pub sq_sig_all: u8,
        pub reserved0: u8,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub sq_npages: u32,
        pub rq_npages: u32,
        /// XRC_TGT: its XRC domain (§13.7); else 0.
        pub xrcdn: u32,
    }

    /// CREATE_QP response.
    "vrdma_resp_create_qp", size 8:
    pub struct VrdmaRespCreateQp {
        pub qpn: u32,
        pub reserved: u32,
    }

    /// Address vector (QP primary path and AHs).
    "vrdma_av", size 36:
    pub struct VrdmaAv {
        pub dgid: [u8; 16],
        pub flow_label: u32,
        pub sgid_index: u8,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub sl: u8,
        pub dmac: [u8; 6],
        /// 0xffff: untagged.
        pub vlan_id: u16,
        pub reserved: u32,
    }

    /// QP attributes (MODIFY_QP request body, QUERY_QP response).
    "vrdma_qp_attr", size 104:
    pub struct VrdmaQpAttr {
        pub qp_state: u32,
        pub cur_qp_state: u32,
        /// IB MTU enum: 1=256 ... 5=4096.
        pub path_mtu: u32,
        pub qkey: u32,
        pub rq_psn: u32,
        pub sq_psn: u32,
        pub dest_qp_num: u32,
        /// `VRDMA_ACCESS_REMOTE_*`.
        pub qp_access_flags: u32,
        pub pkey_index: u16,
        pub en_sqd_async_notify: u8,
        pub sq_draining: u8,
        pub max_rd_atomic: u8,
        pub max_dest_rd_atomic: u8,
        pub min_rnr_timer: u8,
        pub timeout: u8,
        pub retry_cnt: u8,
        pub rnr_retry: u8,
        pub port_num: u8,
        pub reserved0: u8,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub reserved1: u32,
        pub av: VrdmaAv,
    }

    /// MODIFY_QP request.
    "vrdma_cmd_modify_qp", size 112:
    pub struct VrdmaCmdModifyQp {
        pub qpn: u32,
        /// `VRDMA_QP_*`.
        pub attr_mask: u32,
        pub attr: VrdmaQpAttr,
    }

    /// CREATE_SRQ request; the SRQ ring's page list follows.
    "vrdma_cmd_create_srq", size 32:
    pub struct VrdmaCmdCreateSrq {
        pub pdn: u32,
        /// Power of two.
        pub depth: u32,
        pub wqe_shift: u8,
        /// `VRDMA_SRQT_*`.
        pub srq_type: u8,
        pub reserved0: [u8; 2],
        pub max_sge: u32,
        pub srq_limit: u32,
        pub npages: u32,
        /// XRC SRQs: their XRC domain (§13.7); else 0.
        pub xrcdn: u32,
        /// XRC SRQs: the CQ of their receive completions; else 0.
        pub cqn: u32,
    }

    /// MODIFY_SRQ request; with `VRDMA_SRQ_MAX_WR` the new ring's page list follows (§11.7).
    "vrdma_cmd_modify_srq", size 24:
    pub struct VrdmaCmdModifySrq {
        pub srqn: u32,
        /// `VRDMA_SRQ_*`.
        pub attr_mask: u32,
        /// `VRDMA_SRQ_MAX_WR`: the new depth (power of two).
        pub max_wr: u32,
        pub srq_limit: u32,
        /// `VRDMA_SRQ_MAX_WR`: trailing page list length; 0 otherwise.
        pub npages: u32,
        pub reserved: u32,
    }

    /// QUERY_SRQ response.
    "vrdma_resp_query_srq", size 16:
    pub struct VrdmaRespQuerySrq {
        pub max_wr: u32,
        pub max_sge: u32,
        pub srq_limit: u32,
        pub reserved: u32,
    }

    /// CREATE_AH request (response: [`VrdmaHandle`] with the AH index).
    "vrdma_cmd_create_ah", size 44:
    pub struct VrdmaCmdCreateAh {
        pub pdn: u32,
        pub reserved: u32,
        pub av: VrdmaAv,
    }

    /// REG_MR (and the other MR registrations) request; REG_MR is followed by `npages` `__le64`
    /// page addresses of `1 << page_shift` bytes each.
    "vrdma_cmd_reg_mr", size 32:
    pub struct VrdmaCmdRegMr {
        pub pdn: u32,
        /// `VRDMA_ACCESS_*`.
        pub access: u32,
        pub iova: u64,
        pub length: u64,
        pub page_shift: u32,
        /// REG_MR: page list length; ALLOC_FAST_REG_MR: max_num_sg.
        pub npages: u32,
    }

    /// REREG_MR request (§11): the MR's current key, then the whole new MR as for REG_MR;
    /// `npages` `__le64` page addresses follow.
    "vrdma_cmd_rereg_mr", size 40:
    pub struct VrdmaCmdReregMr {
        pub key: u32,
        pub pdn: u32,
        /// `VRDMA_ACCESS_*`.
        pub access: u32,
        pub page_shift: u32,
        pub iova: u64,
        pub length: u64,
        pub npages: u32,
        pub reserved: u32,
    }

    /// MR registration response.
    "vrdma_resp_reg_mr", size 8:
    pub struct VrdmaRespRegMr {
        pub lkey: u32,
        pub rkey: u32,
    }

    /// ALLOC_MW request (§12.8); the response is a [`VrdmaHandle`] with the window's rkey.
    "vrdma_cmd_alloc_mw", size 8:
    pub struct VrdmaCmdAllocMw {
        pub pdn: u32,
        /// `VRDMA_MW_TYPE_*`.
        pub type_: u32,
    }

    /// ADVISE_MR request.
    "vrdma_cmd_advise_mr", size 32:
    pub struct VrdmaCmdAdviseMr {
        pub lkey: u32,
        /// `VRDMA_ADVISE_*`.
        pub advice: u32,
        /// `VRDMA_ADVISE_F_*`.
        pub flags: u32,
        pub reserved: u32,
        pub iova: u64,
        pub length: u64,
    }

    /// ODP_PAGE_RESP request; `npages` `__le64` guest physical 4 KiB page addresses follow.
    "vrdma_cmd_odp_page_resp", size 32:
    pub struct VrdmaCmdOdpPageResp {
        pub req_id: u32,
        pub mr_key: u32,
        /// `VRDMA_STATUS_OK`, `ACCESS` or `BAD_ADDRESS`.
        pub status: u32,
        /// `VRDMA_ODP_RESP_F_*`.
        pub flags: u32,
        /// Page-aligned start covered.
        pub iova: u64,
        /// 4 KiB pages that follow.
        pub npages: u32,
        pub reserved: u32,
    }

    /// ODP_INVALIDATE request: completes when no access to the range is in flight.
    "vrdma_cmd_odp_invalidate", size 24:
    pub struct VrdmaCmdOdpInvalidate {
        pub mr_key: u32,
        pub reserved: u32,
        pub iova: u64,
        pub length: u64,
    }

    /// MODIFY_CQ request (§5.5).
    "vrdma_cmd_modify_cq", size 8:
    pub struct VrdmaCmdModifyCq {
        pub cqn: u32,
        /// CQEs; below 2 (or a period of 0) turns moderation off.
        pub cq_count: u16,
        /// Microseconds.
        pub cq_period: u16,
    }

    /// QUERY_STATS request (§11.9).
    "vrdma_cmd_query_stats", size 8:
    pub struct VrdmaCmdQueryStats {
        /// 0: the port.
        pub qpn: u32,
        /// Must be 0.
        pub flags: u32,
    }

    /// QUERY_STATS response (§11.9): counters since QP creation / device start.
    "vrdma_stats", size 128:
    pub struct VrdmaStats {
        pub tx_packets: u64,
        pub tx_bytes: u64,
        pub rx_packets: u64,
        pub rx_bytes: u64,
        pub retransmits: u64,
        pub timeouts: u64,
        pub rnr_naks_rx: u64,
        pub rnr_naks_tx: u64,
        pub seq_naks_rx: u64,
        pub seq_naks_tx: u64,
        /// Port only.
        pub icrc_errors: u64,
        /// Port only.
        pub rx_dropped: u64,
        /// Port only.
        pub odp_faults: u64,
        pub reserved: [u64; 3],
    }
}

// ---------------------------------------------------------------------------------------------
// The `wr` union of the send WQE
// ---------------------------------------------------------------------------------------------

/// Copies the first `size_of::<T>()` bytes of `raw` into a `T` (missing bytes read as zero).
fn union_view<T: Abi>(raw: &[u8]) -> T {
    let mut v = T::default();
    for (d, s) in v.as_bytes_mut().iter_mut().zip(raw.iter()) {
        *d = *s;
    }
    v
}

/// Zeroes `raw` and copies `v`'s bytes to its start.
fn union_set<T: Abi>(raw: &mut [u8], v: &T) {
    raw.fill(0);
    for (d, s) in raw.iter_mut().zip(v.as_bytes().iter()) {
        *d = *s;
    }
}

impl VrdmaSendWqe {
    /// `wr.rdma` (RDMA WRITE, RDMA WRITE with immediate, RDMA READ).
    pub fn rdma(&self) -> VrdmaWqeRdma {
        union_view(&self.wr)
    }
    /// `wr.atomic` (ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD).
    pub fn atomic(&self) -> VrdmaWqeAtomic {
        union_view(&self.wr)
    }
    /// `wr.atomic_write` (ATOMIC_WRITE).
    pub fn atomic_write(&self) -> VrdmaWqeAtomicWrite {
        union_view(&self.wr)
    }
    /// `wr.flush` (FLUSH).
    pub fn flush(&self) -> VrdmaWqeFlush {
        union_view(&self.wr)
    }
    /// `wr.ud` (any send on a UD or GSI QP).
    pub fn ud(&self) -> VrdmaWqeUd {
        union_view(&self.wr)
    }
    /// `wr.reg` (REG_MR).
    pub fn reg(&self) -> VrdmaWqeReg {
        union_view(&self.wr)
    }
    /// Stores `wr.rdma`, zeroing the rest of the union.
    pub fn set_rdma(&mut self, v: VrdmaWqeRdma) {
        union_set(&mut self.wr, &v)
    }
    /// Stores `wr.atomic`, zeroing the rest of the union.
    pub fn set_atomic(&mut self, v: VrdmaWqeAtomic) {
        union_set(&mut self.wr, &v)
    }
    /// Stores `wr.atomic_write`, zeroing the rest of the union.
    pub fn set_atomic_write(&mut self, v: VrdmaWqeAtomicWrite) {
        union_set(&mut self.wr, &v)
    }
    /// Stores `wr.flush`, zeroing the rest of the union.
    pub fn set_flush(&mut self, v: VrdmaWqeFlush) {
        union_set(&mut self.wr, &v)
    }
    /// Stores `wr.ud`, zeroing the rest of the union.
    pub fn set_ud(&mut self, v: VrdmaWqeUd) {
        union_set(&mut self.wr, &v)
    }
    /// Stores `wr.reg`, zeroing the rest of the union.
    pub fn set_reg(&mut self, v: VrdmaWqeReg) {
        union_set(&mut self.wr, &v)
    }
    /// `wr.bind_mw` (BIND_MW).
    pub fn bind_mw(&self) -> VrdmaWqeBindMw {
        union_view(&self.wr)
    }
    /// Stores `wr.bind_mw`, zeroing the rest of the union.
    pub fn set_bind_mw(&mut self, v: VrdmaWqeBindMw) {
        union_set(&mut self.wr, &v)
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers mirroring the C macros and the ring rules of §4 / §6
// ---------------------------------------------------------------------------------------------

/// `VRDMA_KEY_INDEX(key)`: the MR table index of a key (§12.1).
pub const fn vrdma_key_index(key: u32) -> u32 {
    key >> 8
}

/// `VRDMA_KEY_VARIANT(key)`: the variant byte of a key (§12.1).
pub const fn vrdma_key_variant(key: u32) -> u8 {
    (key & 0xff) as u8
}

/// Builds a key from an index (< 2^24; higher bits are dropped) and a variant byte.
pub const fn vrdma_make_key(index: u32, variant: u8) -> u32 {
    (index << 8) | variant as u32
}

/// Smallest ring entry size in bytes (RQ/SRQ slots; §4).
pub const VRDMA_RING_MIN_ENTRY: u32 = 32;
/// Largest ring entry size in bytes (§4).
pub const VRDMA_RING_MAX_ENTRY: u32 = 4096;
/// Size of the send WQE header (§6.1) and of a CQE (§7).
pub const VRDMA_SEND_WQE_HDR_SIZE: u32 = 64;
/// Size of the receive WQE header (§6.2).
pub const VRDMA_RECV_WQE_HDR_SIZE: u32 = 16;
/// Size of one SGE.
pub const VRDMA_SGE_SIZE: u32 = 16;
/// Size of one CQE.
pub const VRDMA_CQE_SIZE: u32 = 64;
/// Size of the GRH area at the start of a UD/GSI receive buffer (§6.2).
pub const VRDMA_GRH_SIZE: u32 = 40;

/// Number of 4 KiB pages of a ring (§4): the control page plus
/// `ceil(depth * entry_size / 4096)` entry pages.
///
/// Returns `None` unless `depth` is a nonzero power of two, `entry_size` a power of two in
/// 32..=4096, and the result fits in `u32`.
pub const fn ring_npages(depth: u32, entry_size: u32) -> Option<u32> {
    if depth == 0 || !depth.is_power_of_two() {
        return None;
    }
    if !entry_size.is_power_of_two()
        || entry_size < VRDMA_RING_MIN_ENTRY
        || entry_size > VRDMA_RING_MAX_ENTRY
    {
        return None;
    }
    let bytes = depth as u64 * entry_size as u64;
    let pages = bytes.div_ceil(VRDMA_PAGE_SIZE) + 1;
    if pages > u32::MAX as u64 {
        None
    } else {
        Some(pages as u32)
    }
}

/// The slot of free-running index `index` in a ring of `depth` entries (`depth` a power of two).
pub const fn ring_slot(index: u32, depth: u32) -> u32 {
    index & depth.wrapping_sub(1)
}

/// Where slot `slot` of a ring with `entry_size`-byte entries lives: `(page, offset)` with `page`
/// an index into the ring's page list (page 0 is the control page, so entries start at page 1)
/// and `offset` the byte offset within that page. Entries never cross a page.
pub const fn ring_entry_location(slot: u32, entry_size: u32) -> (u64, u64) {
    let byte = slot as u64 * entry_size as u64;
    (1 + (byte >> VRDMA_PAGE_SHIFT), byte & (VRDMA_PAGE_SIZE - 1))
}

/// Number of entries between `consumer` and `producer` (free-running indices). A valid ring has
/// `ring_used(p, c) <= depth`; anything larger is `VRDMA_RING_ERR_INDEX` (§4).
pub const fn ring_used(producer: u32, consumer: u32) -> u32 {
    producer.wrapping_sub(consumer)
}

/// Maximum SGEs that fit a send WQE slot of `1 << sq_wqe_shift` bytes.
pub const fn sq_max_sge(sq_wqe_shift: u8) -> u32 {
    if sq_wqe_shift >= 32 {
        return 0;
    }
    (1u32 << sq_wqe_shift).saturating_sub(VRDMA_SEND_WQE_HDR_SIZE) / VRDMA_SGE_SIZE
}

/// Maximum inline bytes that fit a send WQE slot of `1 << sq_wqe_shift` bytes.
pub const fn sq_max_inline(sq_wqe_shift: u8) -> u32 {
    if sq_wqe_shift >= 32 {
        return 0;
    }
    (1u32 << sq_wqe_shift).saturating_sub(VRDMA_SEND_WQE_HDR_SIZE)
}

/// Maximum SGEs that fit a receive WQE slot of `1 << rq_wqe_shift` bytes (RQ and SRQ).
pub const fn rq_max_sge(rq_wqe_shift: u8) -> u32 {
    if rq_wqe_shift >= 32 {
        return 0;
    }
    (1u32 << rq_wqe_shift).saturating_sub(VRDMA_RECV_WQE_HDR_SIZE) / VRDMA_SGE_SIZE
}

/// IB MTU enum (1..=5) to bytes (256..=4096); `None` for other values.
pub const fn ib_mtu_to_bytes(mtu: u32) -> Option<u32> {
    match mtu {
        1..=5 => Some(128 << mtu),
        _ => None,
    }
}

/// ODP chunk size in bytes for `odp_chunk_shift` (§10); `None` if the shift is below the page
/// shift or 64 and above.
pub const fn odp_chunk_size(odp_chunk_shift: u32) -> Option<u64> {
    if odp_chunk_shift < VRDMA_PAGE_SHIFT || odp_chunk_shift >= 64 {
        None
    } else {
        Some(1u64 << odp_chunk_shift)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_header_comments() {
        assert_eq!(size_of::<VrdmaConfig>(), 256);
        assert_eq!(size_of::<VrdmaSendWqe>(), 64);
        assert_eq!(size_of::<VrdmaCqe>(), 64);
        assert_eq!(size_of::<VrdmaRecvWqe>(), 16);
        assert_eq!(size_of::<VrdmaEvent>(), 16);
        assert_eq!(size_of::<VrdmaSge>(), 16);
        assert_eq!(VrdmaSendWqe::SIZE, 64);
        assert_eq!(offset_of!(VrdmaSendWqe, wr), 24);
        assert_eq!(offset_of!(VrdmaRingCtrl, consumer), 64);
        assert_eq!(offset_of!(VrdmaRingCtrl, cq_arm), 128);
    }

    #[test]
    fn tables_are_complete_and_unique() {
        assert_eq!(ABI_STRUCTS.len(), 43);
        let mut names: Vec<_> = ABI_STRUCTS.iter().map(|s| s.c_name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ABI_STRUCTS.len());
        let mut consts: Vec<_> = ABI_CONSTANTS.iter().map(|c| c.0).collect();
        consts.sort_unstable();
        consts.dedup();
        assert_eq!(consts.len(), ABI_CONSTANTS.len());
        let doorbell = ABI_STRUCTS
            .iter()
            .find(|s| s.c_name == "vrdma_doorbell")
            .unwrap();
        assert_eq!(doorbell.fields[0].name, "type");
        let wqe = ABI_STRUCTS
            .iter()
            .find(|s| s.c_name == "vrdma_send_wqe")
            .unwrap();
        let atomic = wqe.fields.iter().find(|f| f.name == "wr.atomic").unwrap();
        assert_eq!((atomic.offset, atomic.size), (24, 32));
    }

    #[test]
    fn byte_round_trip_and_short_input() {
        let mut cqe = VrdmaCqe {
            wr_id: 0x0102_0304_0506_0708,
            qpn: 17,
            status: VRDMA_WC_REM_ACCESS_ERR,
            smac: [1, 2, 3, 4, 5, 6],
            ..Default::default()
        };
        cqe.vlan_id = 0xffff;
        let bytes = cqe.as_bytes().to_vec();
        assert_eq!(bytes.len(), 64);
        assert_eq!(&bytes[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&bytes[8..12], &17u32.to_le_bytes());
        assert_eq!(bytes[13], VRDMA_WC_REM_ACCESS_ERR);
        assert_eq!(&bytes[36..42], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(VrdmaCqe::read_from(&bytes), Some(cqe));
        assert_eq!(VrdmaCqe::read_from(&bytes[..63]), None);
        assert_eq!(VrdmaCqe::read_from(&[]), None);

        // Unaligned input and trailing data.
        let mut buf = vec![0xAAu8];
        buf.extend_from_slice(&bytes);
        buf.extend_from_slice(&[9, 9]);
        let (again, rest) = VrdmaCqe::split_from(&buf[1..]).unwrap();
        assert_eq!(again, cqe);
        assert_eq!(rest, &[9, 9]);

        let mut out = [0u8; 70];
        assert_eq!(cqe.write_to(&mut out), Some(()));
        assert_eq!(&out[..64], &bytes[..]);
        assert_eq!(cqe.write_to(&mut out[..10]), None);

        let mut hdr = VrdmaCmdHdr::default();
        hdr.as_bytes_mut()[0] = 0x0b;
        assert_eq!(hdr.opcode, VRDMA_CMD_MODIFY_QP);
    }

    #[test]
    fn union_views() {
        let mut wqe = VrdmaSendWqe {
            opcode: VRDMA_WR_ATOMIC_CMP_AND_SWP,
            ..Default::default()
        };
        wqe.set_atomic(VrdmaWqeAtomic {
            remote_addr: 0x1000,
            rkey: 0x1234_5601,
            reserved: 0,
            compare_add: 7,
            swap: 9,
        });
        let a = wqe.atomic();
        assert_eq!(
            (a.remote_addr, a.rkey, a.compare_add, a.swap),
            (0x1000, 0x1234_5601, 7, 9)
        );
        // rdma view overlays the first 16 bytes.
        assert_eq!(wqe.rdma().remote_addr, 0x1000);
        assert_eq!(wqe.rdma().rkey, 0x1234_5601);
        let b = wqe.as_bytes();
        assert_eq!(&b[24..32], &0x1000u64.to_le_bytes());
        assert_eq!(&b[40..48], &7u64.to_le_bytes());
        // Setting a smaller view zeroes the rest of the union.
        wqe.set_ud(VrdmaWqeUd {
            ah_index: 3,
            remote_qpn: 0x11,
            remote_qkey: 0x8001_0000,
            reserved: 0,
        });
        assert_eq!(wqe.ud().ah_index, 3);
        assert_eq!(wqe.atomic().compare_add, 0);
        assert!(wqe.wr[16..].iter().all(|&x| x == 0));
        wqe.set_reg(VrdmaWqeReg {
            iova: 1,
            length: 2,
            key: 3,
            access: 4,
            page_list_len: 5,
            page_shift: 12,
            page_list_addr: 0xdead_0000,
        });
        assert_eq!(wqe.reg().page_list_addr, 0xdead_0000);
        assert_eq!(&wqe.as_bytes()[56..64], &0xdead_0000u64.to_le_bytes());
    }

    #[test]
    fn key_helpers() {
        let key = vrdma_make_key(0x12_3456, 0x78);
        assert_eq!(key, 0x1234_5678);
        assert_eq!(vrdma_key_index(key), 0x12_3456);
        assert_eq!(vrdma_key_variant(key), 0x78);
        assert_eq!(vrdma_key_index(0xffff_ffff), 0xff_ffff);
    }

    #[test]
    fn ring_helpers() {
        // 256 CQEs of 64 bytes = 4 pages + control page.
        assert_eq!(ring_npages(256, 64), Some(5));
        // Partial page rounds up.
        assert_eq!(ring_npages(1, 64), Some(2));
        assert_eq!(ring_npages(16384, 4096), Some(16385));
        assert_eq!(ring_npages(0, 64), None);
        assert_eq!(ring_npages(3, 64), None);
        assert_eq!(ring_npages(4, 48), None);
        assert_eq!(ring_npages(4, 16), None);
        assert_eq!(ring_npages(4, 8192), None);
        assert_eq!(ring_npages(1 << 31, 4096), Some((1 << 31) + 1));

        assert_eq!(ring_slot(0xffff_ffff, 16), 15);
        assert_eq!(ring_slot(16, 16), 0);
        assert_eq!(ring_entry_location(0, 64), (1, 0));
        assert_eq!(ring_entry_location(63, 64), (1, 4032));
        assert_eq!(ring_entry_location(64, 64), (2, 0));
        assert_eq!(ring_entry_location(3, 4096), (4, 0));
        assert_eq!(ring_used(2, 0xffff_fffe), 4);
        assert_eq!(ring_used(5, 5), 0);

        assert_eq!(sq_max_sge(6), 0);
        assert_eq!(sq_max_sge(7), 4);
        assert_eq!(sq_max_inline(8), 192);
        assert_eq!(rq_max_sge(5), 1);
        assert_eq!(rq_max_sge(40), 0);
        assert_eq!(sq_max_inline(3), 0);
    }

    #[test]
    fn misc_helpers() {
        assert_eq!(ib_mtu_to_bytes(1), Some(256));
        assert_eq!(ib_mtu_to_bytes(3), Some(1024));
        assert_eq!(ib_mtu_to_bytes(5), Some(4096));
        assert_eq!(ib_mtu_to_bytes(0), None);
        assert_eq!(ib_mtu_to_bytes(6), None);
        assert_eq!(odp_chunk_size(21), Some(2 << 20));
        assert_eq!(odp_chunk_size(11), None);
        assert_eq!(odp_chunk_size(64), None);
    }

    #[test]
    fn page_list_decoding() {
        let mut b = Vec::new();
        for v in [0x1000u64, 0x2000, 0xffff_ffff_ffff_f000] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(
            read_u64_array(&b, 3),
            Some(vec![0x1000, 0x2000, 0xffff_ffff_ffff_f000])
        );
        assert_eq!(read_u64_array(&b, 2), Some(vec![0x1000, 0x2000]));
        assert_eq!(read_u64_array(&b, 4), None);
        assert_eq!(read_u64_array(&b, usize::MAX), None);
        assert_eq!(read_u64_array(&[], 0), Some(vec![]));
    }

    #[test]
    fn zero_default() {
        assert!(VrdmaConfig::default().as_bytes().iter().all(|&b| b == 0));
        assert_eq!(VrdmaQpAttr::ZERO.av, VrdmaAv::ZERO);
    }
}
