//! Device limits and identity (`DeviceConfig`) and the config space (`struct vrdma_config`, §2.2).

use vrdma_spec::*;

use crate::memory::mr::PAGE_SIZE_CAP;
use crate::memory::OdpConfig;

/// Limits and identity of one device, from the CLI.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    pub mac: [u8; 6],
    /// Ethernet (IP) MTU.
    pub mtu: u16,
    pub max_pd: u32,
    pub max_qp: u32,
    pub max_cq: u32,
    pub max_srq: u32,
    pub max_mr: u32,
    pub max_ah: u32,
    /// Memory windows (spec §2.2, §12.8); 0: not supported. The CLI sets it to `max_mr`.
    pub max_mw: u32,
    pub max_qp_wr: u32,
    pub max_srq_wr: u32,
    pub max_cqe: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_srq_sge: u32,
    pub max_inline_data: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_fast_reg_page_list_len: u32,
    pub max_gid: u32,
    pub max_msg_sz: u32,
    pub max_mr_size: u64,
    /// Page-list entries all MRs may hold together (not in the config space; REG_MR and
    /// friends beyond it: NO_RESOURCES, spec §11.8).
    pub max_mr_pages: u64,
    /// Host memory the device's guest-sized state may use (`--max-host-memory-per-device`,
    /// spec §16.1; see `budget.rs`). Not in the config space.
    pub max_host_memory: u64,
    /// The daemon's budget the device's is part of (spec §16.1, §16.4), if any.
    pub host_memory_pool: Option<crate::budget::Budget>,
    pub node_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub fw_ver: u64,
    /// Port state reported (ACTIVE unless the uplink is down).
    pub port_active: bool,
    /// On-demand paging. `odp.enabled` / `odp.implicit` decide the ODP feature bits and caps.
    pub odp: OdpConfig,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        DeviceConfig {
            mac,
            mtu: 1500,
            max_pd: 65536,
            max_qp: 16384,
            max_cq: 16384,
            max_srq: 4096,
            max_mr: 65536,
            max_ah: 65536,
            max_mw: 65536,
            max_qp_wr: 16384,
            max_srq_wr: 16384,
            max_cqe: 65536,
            max_send_sge: 32,
            max_recv_sge: 32,
            max_srq_sge: 32,
            max_inline_data: 512,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_fast_reg_page_list_len: 512,
            max_gid: 128,
            max_msg_sz: 1 << 31,
            max_mr_size: 1 << 40,
            max_mr_pages: crate::memory::mr::DEFAULT_MAX_MR_PAGES,
            max_host_memory: crate::budget::DEFAULT_MAX_HOST_MEMORY,
            host_memory_pool: None,
            node_guid: guid_from_mac(&mac),
            vendor_id: 0x1af4,
            vendor_part_id: VIRTIO_ID_RDMA,
            hw_ver: 1,
            fw_ver: VRDMA_ABI_VERSION as u64,
            port_active: true,
            // ODP works end to end (tests/device_odp_e2e.rs): explicit and implicit MRs.
            odp: OdpConfig::default(),
        }
    }
}

/// EUI-64 from a MAC (as RoCE devices derive their node GUID).
pub fn guid_from_mac(mac: &[u8; 6]) -> u64 {
    let b = [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    u64::from_be_bytes(b)
}

/// Largest IB MTU enum (1..=5) whose full-size RoCEv2 packets fit the Ethernet (IP) MTU, headers
/// included (`wire::mtu`: 1500 → 1024 like rxe, 9000 → 4096); 1 (256) if even that does not fit.
pub fn ib_mtu_for_eth(mtu: u16) -> u32 {
    crate::wire::mtu::ib_mtu_for_ip_mtu(mtu as u32).unwrap_or(1)
}

impl DeviceConfig {
    /// Port MTU as IB enum.
    pub fn port_mtu(&self) -> u32 {
        ib_mtu_for_eth(self.mtu)
    }

    /// Device-specific virtio feature bits (bit numbers VIRTIO_RDMA_F_*): ODP bits only when
    /// enabled; ETH is up to the vhost-user layer.
    pub fn odp_feature_bits(&self) -> u64 {
        let mut f = 0u64;
        if self.odp.enabled {
            f |= 1 << VIRTIO_RDMA_F_ODP;
        }
        if self.odp.implicit {
            f |= 1 << VIRTIO_RDMA_F_ODP_IMPLICIT;
        }
        f
    }

    /// The ODP operations (`VRDMA_ODP_*`) advertised for QPs of type `qp_type` (`VRDMA_QPT_*`;
    /// GSI counts as UD): `odp_rc_caps` / `odp_uc_caps` / `odp_ud_caps` of spec §2.2, and what
    /// the transport enforces (an operation not listed → LOC_PROT_ERR / remote access error).
    pub fn odp_caps(&self, qp_type: u32) -> u32 {
        if !self.odp.enabled {
            return 0;
        }
        match qp_type {
            // XRC has RC's responder (RNR NAKs), so it gets RC's caps (spec §13.7).
            VRDMA_QPT_RC | VRDMA_QPT_XRC_INI | VRDMA_QPT_XRC_TGT => {
                VRDMA_ODP_SEND
                    | VRDMA_ODP_RECV
                    | VRDMA_ODP_WRITE
                    | VRDMA_ODP_READ
                    | VRDMA_ODP_ATOMIC
                    | VRDMA_ODP_SRQ_RECV
            }
            // A UC responder cannot RNR-NAK: a fault in the middle of a multi-packet message
            // would lose it after part of it was placed, so only the requester side (local SGEs
            // of SENDs) is advertised.
            VRDMA_QPT_UC => VRDMA_ODP_SEND,
            // UD is unreliable anyway: a datagram whose receive buffer faults is dropped and the
            // receive WQE stays the head (spec §14.6), so RECV and SRQ_RECV are usable.
            VRDMA_QPT_UD | VRDMA_QPT_GSI => VRDMA_ODP_SEND | VRDMA_ODP_RECV | VRDMA_ODP_SRQ_RECV,
            _ => 0,
        }
    }

    /// The config space / QUERY_DEVICE body.
    pub fn to_vrdma_config(&self) -> VrdmaConfig {
        let mut general = 0;
        let (rc, uc, ud) = (
            self.odp_caps(VRDMA_QPT_RC),
            self.odp_caps(VRDMA_QPT_UC),
            self.odp_caps(VRDMA_QPT_UD),
        );
        if self.odp.enabled {
            general |= VRDMA_ODP_SUPPORT;
        }
        if self.odp.implicit {
            general |= VRDMA_ODP_SUPPORT_IMPLICIT;
        }
        VrdmaConfig {
            mac: self.mac,
            mtu: self.mtu,
            max_pd: self.max_pd,
            max_qp: self.max_qp,
            max_cq: self.max_cq,
            max_srq: self.max_srq,
            max_mr: self.max_mr,
            max_ah: self.max_ah,
            max_mw: self.max_mw,
            max_mcast_grp: crate::objects::mcast::MAX_MCAST_GROUPS,
            max_mcast_qp_attach: crate::objects::mcast::MAX_MCAST_QP_ATTACH,
            max_qp_wr: self.max_qp_wr,
            max_srq_wr: self.max_srq_wr,
            max_cqe: self.max_cqe,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_srq_sge: self.max_srq_sge,
            max_inline_data: self.max_inline_data,
            max_qp_rd_atom: self.max_qp_rd_atom,
            max_qp_init_rd_atom: self.max_qp_init_rd_atom,
            max_fast_reg_page_list_len: self.max_fast_reg_page_list_len,
            max_gid: self.max_gid,
            max_msg_sz: self.max_msg_sz,
            atomic_cap: VRDMA_ATOMIC_HCA,
            odp_general_caps: general,
            odp_rc_caps: rc,
            odp_uc_caps: uc,
            odp_ud_caps: ud,
            odp_chunk_shift: self
                .odp
                .chunk_shift
                .clamp(VRDMA_ODP_CHUNK_SHIFT_MIN, VRDMA_ODP_CHUNK_SHIFT_MAX),
            port_state: if self.port_active {
                VRDMA_PORT_ACTIVE
            } else {
                VRDMA_PORT_DOWN
            },
            vendor_id: self.vendor_id,
            vendor_part_id: self.vendor_part_id,
            hw_ver: self.hw_ver,
            device_caps: VRDMA_DEVCAP_ATOMIC_WRITE
                | VRDMA_DEVCAP_FLUSH_GLOBAL
                | VRDMA_DEVCAP_SRQ_RESIZE
                | VRDMA_DEVCAP_CQ_MODERATION
                | VRDMA_DEVCAP_XRC,
            max_mr_size: self.max_mr_size,
            page_size_cap: PAGE_SIZE_CAP,
            node_guid: self.node_guid,
            fw_ver: self.fw_ver,
            reserved: [0; 88],
        }
    }

    /// The 256 config-space bytes.
    pub fn config_space(&self) -> Vec<u8> {
        self.to_vrdma_config().as_bytes().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_and_port_mtu_follow_the_mac_and_the_ethernet_mtu() {
        assert_eq!(guid_from_mac(&[0, 1, 2, 3, 4, 5]), 0x0201_02ff_fe03_0405);
        assert_eq!(ib_mtu_for_eth(1500), 3);
        assert_eq!(ib_mtu_for_eth(576), 1);
        assert_eq!(ib_mtu_for_eth(4180), 5);
        assert_eq!(ib_mtu_for_eth(4179), 4);
    }
}
