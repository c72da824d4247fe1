//! Device state for live migration (spec §17): [`save`] serializes what the daemon holds for a
//! stopped device, [`restore`] rebuilds it in the destination daemon's device.
//!
//! The stream is untrusted input for the destination (it crossed the migration channel): every
//! length is checked against the bytes that remain before anything is allocated, every handle
//! against the table's limits, every reference (a QP's PD, CQs and SRQ, an MR's PD, ...) against
//! the objects restored before it, and the CRC-32 of the whole stream is checked first. Any
//! failure is a [`SnapshotError`] and leaves the device at power-on state, never a panic.
//!
//! Layout (all little endian, spec §17.3): header (`MAGIC`, version, body length), the
//! configuration fingerprint, then one section per object kind in dependency order (GIDs, PDs,
//! AHs, CQs, SRQs, MRs, QPs), each a count followed by its entries, then the CRC-32 of
//! everything before it.
//!
//! Transport state in flight moves too: the requester's fetched send WQEs with their progress
//! (the destination retransmits from the unacknowledged PSN at once, as after a timeout, IBTA
//! 9.7.6) and the responder's message in progress (its receive WQE and RDMA WRITE context).
//! What is not carried (spec §17.2): READ responses being paced, an ODP fault being waited for,
//! memory windows, multicast attachments and parked commands. [`save`] refuses a device that
//! holds any of them ([`SnapshotError::Busy`]): the migration fails and the source keeps running.
//! Responder resources for duplicate READ / atomic requests are dropped, ODP MRs come back with
//! no resident chunk (the driver gets page requests again on the destination).

mod qp;

use thiserror::Error;
use vrdma_spec::*;

use super::commands::cq_charge;
use super::Device;
use super::Qp;
use crate::guest::{Ring, RingError};
use crate::memory::mr::{Mr, MrError, MrKind};
use crate::memory::odp::OdpMr;
use crate::objects::cq::CQE_SHIFT;
use crate::objects::{Ah, Cq, Pd, Srq};
use crate::qp::{QpAttrs, QpCaps, QpState, QpType};
use crate::transport::requester::{SendWqe, Sge, WqeState};
use crate::transport::responder::{MsgOp, RecvWqe, WriteCtx};
use crate::transport::sgelist::SgeList;
use qp::{get_qp, put_qp};

/// First bytes of every device state stream.
pub const MAGIC: [u8; 8] = *b"VRDMAST\0";
/// The stream version this daemon writes and the only one it reads.
pub const VERSION: u32 = 1;
/// Largest stream accepted (bounds what a destination reads into memory).
pub const MAX_STATE_BYTES: usize = 256 << 20;

const SEC_GID: u16 = 1;
const SEC_PD: u16 = 2;
const SEC_AH: u16 = 3;
const SEC_CQ: u16 = 4;
const SEC_SRQ: u16 = 5;
const SEC_MR: u16 = 6;
const SEC_QP: u16 = 7;

const MR_PAGE_LIST: u8 = 1;
const MR_DMA: u8 = 2;
const MR_FAST_REG: u8 = 3;
const MR_ODP: u8 = 4;
const MR_IMPLICIT_ODP: u8 = 5;

/// Errors of saving and restoring device state.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// The device holds state that does not migrate (spec §17.2); try again when it is idle.
    #[error("device state cannot be saved now: {0}")]
    Busy(&'static str),
    #[error("device state ends early at byte {0}")]
    Truncated(usize),
    #[error("not a vrdma device state stream (bad magic)")]
    BadMagic,
    #[error("device state version {0} is not supported (this daemon reads {VERSION})")]
    Version(u32),
    #[error("device state is {0} bytes, more than {MAX_STATE_BYTES}")]
    TooLarge(usize),
    #[error("device state checksum mismatch")]
    Checksum,
    #[error("device state has {0} trailing bytes")]
    Trailing(usize),
    #[error("device state section {found} where {expected} was expected")]
    Section { expected: u16, found: u16 },
    #[error("the destination device differs from the source: {0}")]
    ConfigMismatch(&'static str),
    #[error("invalid {what} in device state: {value:#x}")]
    Invalid { what: &'static str, value: u64 },
    #[error("ring in device state: {0}")]
    Ring(#[from] RingError),
    #[error("MR in device state: {0}")]
    Mr(#[from] MrError),
    #[error("restored objects exceed the host-memory budget")]
    NoResources,
}

fn invalid(what: &'static str, value: impl Into<u64>) -> SnapshotError {
    SnapshotError::Invalid {
        what,
        value: value.into(),
    }
}

/// Little-endian writer.
#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn bool(&mut self, v: bool) {
        self.buf.push(v as u8);
    }
    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    fn opt_u32(&mut self, v: Option<u32>) {
        self.bool(v.is_some());
        self.u32(v.unwrap_or(0));
    }
    fn pages(&mut self, pages: &[u64]) {
        self.u32(pages.len() as u32);
        for &p in pages {
            self.u64(p);
        }
    }
    fn ring(&mut self, r: &Ring) {
        self.u32(r.depth());
        self.u32(r.entry_shift());
        self.u32(r.dev_index());
        self.pages(r.pages());
    }
}

/// Bounds-checked little-endian reader over an untrusted stream.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(SnapshotError::Truncated(self.pos))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.array::<1>()?[0])
    }
    fn bool(&mut self) -> Result<bool, SnapshotError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(invalid("boolean", v)),
        }
    }
    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn opt_u32(&mut self) -> Result<Option<u32>, SnapshotError> {
        let some = self.bool()?;
        let v = self.u32()?;
        Ok(some.then_some(v))
    }
    /// A count of entries of at least `min_entry` bytes each: refused unless that many bytes
    /// remain, so no allocation is ever sized by an unchecked number.
    fn count(&mut self, min_entry: usize) -> Result<usize, SnapshotError> {
        let n = self.u32()? as usize;
        let remaining = self.buf.len() - self.pos;
        if n.saturating_mul(min_entry.max(1)) > remaining {
            return Err(SnapshotError::Truncated(self.pos));
        }
        Ok(n)
    }
    /// [`Reader::count`], and at most `max` (a table's limit): what is read before the table
    /// checks it is bounded by the destination's configuration, not by the stream's length.
    fn count_at_most(&mut self, min_entry: usize, max: u32) -> Result<usize, SnapshotError> {
        let n = self.count(min_entry)?;
        if n as u64 > u64::from(max) {
            return Err(invalid("object count", n as u64));
        }
        Ok(n)
    }

    /// A page list; no command delivers more than `VRDMA_CMD_MAX_PAGES` (fast-registration
    /// lists: the device's `max_fast_reg_page_list_len`), so no more is read.
    fn pages(&mut self, max: u32) -> Result<Vec<u64>, SnapshotError> {
        let n = self.count_at_most(8, max)?;
        (0..n).map(|_| self.u64()).collect()
    }
    fn ring(&mut self, min_shift: u32, max_depth: u32) -> Result<Ring, SnapshotError> {
        let depth = self.u32()?;
        let shift = self.u32()?;
        let dev_index = self.u32()?;
        let pages = self.pages(VRDMA_CMD_MAX_PAGES)?;
        Ok(Ring::from_saved(
            &pages, depth, shift, dev_index, min_shift, max_depth,
        )?)
    }
    fn abi<T: Abi>(&mut self) -> Result<T, SnapshotError> {
        let b = self.take(T::SIZE)?;
        T::read_from(b).ok_or(SnapshotError::Truncated(self.pos))
    }
    fn section(&mut self, expected: u16) -> Result<(), SnapshotError> {
        let found = self.u16()?;
        if found != expected {
            return Err(SnapshotError::Section { expected, found });
        }
        Ok(())
    }
}

/// Why `dev` cannot be saved now, if it cannot (spec §17.2).
fn busy_reason(dev: &Device) -> Option<&'static str> {
    if dev.needs_reset {
        return Some("the device needs a reset");
    }
    if dev.mrs.read().mw_count() > 0 {
        return Some("memory windows are allocated");
    }
    if dev.mcast.read().group_count() > 0 {
        return Some("QPs are attached to multicast groups");
    }
    // XRC domains, XRC SRQs and XRC QPs (spec §13.7) are not in the state format yet.
    if !dev.xrcds.is_empty() {
        return Some("XRC domains are allocated");
    }
    let odp_busy = {
        let mrs = dev.mrs.read();
        mrs.odp.pending_requests() > 0 || mrs.odp_parked_advises() > 0
    };
    if odp_busy {
        return Some("ODP page requests are outstanding");
    }
    for qp in dev.qps.iter() {
        let (req, resp) = (&qp.req, &qp.resp);
        if req.taken || resp.taken || req.fatal.is_some() || resp.fatal.is_some() {
            return Some("a QP is in the middle of a transport step");
        }
        if req.odp_wait.is_some() {
            return Some("a QP waits for an ODP fault");
        }
        if req.wqes.iter().any(|w| w.opcode == VRDMA_WR_BIND_MW) {
            return Some("a QP has a BIND_MW WQE in flight");
        }
        if !resp.replies.is_empty() {
            return Some("a QP has responses to send");
        }
    }
    None
}

fn put_config(w: &mut Writer, dev: &Device) {
    let c = &dev.config;
    w.bytes(&c.mac);
    w.u16(c.mtu);
    for v in [
        c.max_pd,
        c.max_qp,
        c.max_cq,
        c.max_srq,
        c.max_mr,
        c.max_ah,
        c.max_gid,
        c.max_qp_wr,
        c.max_srq_wr,
        c.max_cqe,
    ] {
        w.u32(v);
    }
    w.bool(c.odp.enabled);
    w.bool(c.odp.implicit);
}

fn check_config(r: &mut Reader, dev: &Device) -> Result<(), SnapshotError> {
    let c = &dev.config;
    if r.array::<6>()? != c.mac {
        return Err(SnapshotError::ConfigMismatch("MAC address"));
    }
    if r.u16()? != c.mtu {
        return Err(SnapshotError::ConfigMismatch("MTU"));
    }
    for (name, v) in [
        ("max_pd", c.max_pd),
        ("max_qp", c.max_qp),
        ("max_cq", c.max_cq),
        ("max_srq", c.max_srq),
        ("max_mr", c.max_mr),
        ("max_ah", c.max_ah),
        ("max_gid", c.max_gid),
        ("max_qp_wr", c.max_qp_wr),
        ("max_srq_wr", c.max_srq_wr),
        ("max_cqe", c.max_cqe),
    ] {
        // The guest was told these limits (QUERY_DEVICE); a smaller destination could not hold
        // what it created, a different one would change what it sees.
        if r.u32()? != v {
            return Err(SnapshotError::ConfigMismatch(name));
        }
    }
    if r.bool()? != c.odp.enabled || r.bool()? != c.odp.implicit {
        return Err(SnapshotError::ConfigMismatch("ODP"));
    }
    Ok(())
}

/// Serialize the state of a stopped device (spec §17.3).
pub fn save(dev: &Device) -> Result<Vec<u8>, SnapshotError> {
    if let Some(why) = busy_reason(dev) {
        return Err(SnapshotError::Busy(why));
    }
    let mut w = Writer::default();
    w.bytes(&MAGIC);
    w.u32(VERSION);
    w.u32(0); // body length, patched below
    put_config(&mut w, dev);

    w.u16(SEC_GID);
    let gids: Vec<(u32, _)> = (0..dev.gids.len())
        .filter_map(|i| dev.gids.get(i).map(|g| (i, g)))
        .collect();
    w.u32(gids.len() as u32);
    for (i, g) in gids {
        w.u32(i);
        w.u32(g.gid_type);
        w.bytes(&g.gid);
    }

    w.u16(SEC_PD);
    w.u32(dev.pds.len());
    for (h, _) in dev.pds.iter() {
        w.u32(h);
    }

    w.u16(SEC_AH);
    {
        let ahs = dev.ahs.read();
        w.u32(ahs.len());
        for (h, ah) in ahs.iter() {
            w.u32(h);
            w.u32(ah.pd);
            w.bytes(ah.av.as_bytes());
            w.bytes(&ah.sgid);
        }
    }

    w.u16(SEC_CQ);
    w.u32(dev.cqs.len());
    for (h, cq) in dev.cqs.iter() {
        w.u32(h);
        w.ring(&cq.ring);
        w.bool(cq.broken);
        w.u16(cq.moderation.count);
        w.u16(cq.moderation.period_us);
        w.u16(cq.moderation.held);
    }

    w.u16(SEC_SRQ);
    w.u32(dev.srqs.len());
    for (h, srq) in dev.srqs.iter() {
        w.u32(h);
        w.u32(srq.pd);
        w.ring(&srq.ring);
        w.u32(srq.max_sge);
        w.u32(srq.limit);
        w.bool(srq.broken);
    }

    w.u16(SEC_MR);
    let mrs = dev.mrs.read();
    let slots: Vec<_> = mrs.saved_slots().collect();
    w.u32(slots.len() as u32);
    for (_, variant, mr) in slots {
        w.u8(variant);
        let Some(mr) = mr else {
            w.u8(0);
            continue;
        };
        match &mr.kind {
            MrKind::PageList { .. } => w.u8(MR_PAGE_LIST),
            MrKind::Dma => w.u8(MR_DMA),
            MrKind::FastReg { .. } => w.u8(MR_FAST_REG),
            MrKind::Odp(_) => w.u8(MR_ODP),
            MrKind::ImplicitOdp(_) => w.u8(MR_IMPLICIT_ODP),
            MrKind::Window(_) => return Err(SnapshotError::Busy("memory windows are allocated")),
        }
        w.u32(mr.key);
        w.u32(mr.pd);
        w.u32(mr.access);
        w.u64(mr.iova);
        w.u64(mr.length);
        match &mr.kind {
            MrKind::PageList { page_shift, pages } => {
                w.u32(*page_shift);
                w.pages(pages);
            }
            MrKind::FastReg {
                max_pages,
                page_shift,
                pages,
                valid,
            } => {
                w.u32(*max_pages);
                w.u32(*page_shift);
                w.bool(*valid);
                w.pages(pages);
            }
            _ => {}
        }
    }

    w.u16(SEC_QP);
    let qpns = dev.qps.qpns();
    w.u32(qpns.len() as u32);
    for qpn in qpns {
        let Some(qp) = dev.qps.get(qpn) else { continue };
        put_qp(&mut w, &qp);
    }

    let body = (w.buf.len() - 16) as u32;
    w.buf[12..16].copy_from_slice(&body.to_le_bytes());
    let crc = crc32fast::hash(&w.buf);
    w.u32(crc);
    if w.buf.len() > MAX_STATE_BYTES {
        return Err(SnapshotError::TooLarge(w.buf.len()));
    }
    Ok(w.buf)
}

/// Rebuild `dev` from `bytes` (spec §17.3). `dev` must be the destination's device; whatever it
/// held is dropped first. On error it is left at power-on state.
pub fn restore(dev: &mut Device, bytes: &[u8]) -> Result<(), SnapshotError> {
    dev.reset();
    let r = restore_inner(dev, bytes);
    if r.is_err() {
        dev.reset();
    }
    r
}

fn restore_inner(dev: &mut Device, bytes: &[u8]) -> Result<(), SnapshotError> {
    if bytes.len() > MAX_STATE_BYTES {
        return Err(SnapshotError::TooLarge(bytes.len()));
    }
    if bytes.len() < 20 {
        return Err(SnapshotError::Truncated(bytes.len()));
    }
    if bytes[..8] != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let mut r = Reader { buf: bytes, pos: 8 };
    let version = r.u32()?;
    if version != VERSION {
        return Err(SnapshotError::Version(version));
    }
    let body = r.u32()? as usize;
    let end = 16usize
        .checked_add(body)
        .filter(|&e| e.checked_add(4).is_some_and(|t| t <= bytes.len()))
        .ok_or(SnapshotError::Truncated(bytes.len()))?;
    if end + 4 != bytes.len() {
        return Err(SnapshotError::Trailing(bytes.len() - end - 4));
    }
    let crc = u32::from_le_bytes([bytes[end], bytes[end + 1], bytes[end + 2], bytes[end + 3]]);
    if crc32fast::hash(&bytes[..end]) != crc {
        return Err(SnapshotError::Checksum);
    }
    // From here on the reader only sees the body.
    let mut r = Reader {
        buf: &bytes[..end],
        pos: 16,
    };
    check_config(&mut r, dev)?;

    r.section(SEC_GID)?;
    for _ in 0..r.count_at_most(24, dev.gids.len())? {
        let i = r.u32()?;
        let t = r.u32()?;
        let gid = r.array::<16>()?;
        if dev.gids.get(i).is_some() {
            return Err(invalid("duplicate GID index", i));
        }
        dev.gids
            .add(i, t, gid)
            .map_err(|_| invalid("GID entry", i))?;
    }

    r.section(SEC_PD)?;
    let mut pds = Vec::new();
    for _ in 0..r.count_at_most(4, dev.pds.max())? {
        let h = r.u32()?;
        pds.push((h, Pd { pdn: h }));
    }
    dev.pds.restore(pds).map_err(|h| invalid("PD handle", h))?;

    r.section(SEC_AH)?;
    let mut ahs = Vec::new();
    for _ in 0..r.count_at_most(8 + VrdmaAv::SIZE + 16, dev.ahs.get_mut().max())? {
        let h = r.u32()?;
        let pd = r.u32()?;
        let av = r.abi::<VrdmaAv>()?;
        let sgid = r.array::<16>()?;
        if !dev.pds.contains(pd) {
            return Err(invalid("AH's PD", pd));
        }
        ahs.push((h, Ah { pd, av, sgid }));
    }
    dev.ahs
        .get_mut()
        .restore(ahs)
        .map_err(|h| invalid("AH handle", h))?;

    r.section(SEC_CQ)?;
    let mut cqs = Vec::new();
    let now = std::time::Instant::now();
    for _ in 0..r.count_at_most(23, dev.cqs.max())? {
        let h = r.u32()?;
        let ring = r.ring(CQE_SHIFT, dev.config.max_cqe)?;
        let charge = dev
            .budget
            .try_charge(cq_charge(ring.pages().len()))
            .map_err(|_| SnapshotError::NoResources)?;
        let mut cq = Cq {
            charge,
            ..Cq::new(h, ring)
        };
        cq.broken = r.bool()?;
        cq.moderation.count = r.u16()?;
        cq.moderation.period_us = r.u16()?;
        cq.moderation.held = r.u16()?;
        if cq.moderation.held > 0 {
            // Held CQEs get their event once the destination runs (the period restarts now).
            cq.moderation.deadline = Some(now);
            dev.arm_cq_timer(now, h);
        }
        cqs.push((h, cq));
    }
    dev.cqs.restore(cqs).map_err(|h| invalid("CQ handle", h))?;

    r.section(SEC_SRQ)?;
    let mut srqs = Vec::new();
    for _ in 0..r.count_at_most(29, dev.srqs.max())? {
        let h = r.u32()?;
        let pd = r.u32()?;
        if !dev.pds.contains(pd) {
            return Err(invalid("SRQ's PD", pd));
        }
        let ring = r.ring(5, dev.config.max_srq_wr)?;
        let max_sge = r.u32()?;
        let limit = r.u32()?;
        let broken = r.bool()?;
        if max_sge > dev.config.max_srq_sge || limit > ring.depth() {
            return Err(invalid("SRQ attributes", h));
        }
        let charge = dev
            .budget
            .try_charge(
                (std::mem::size_of::<Srq>() as u64).saturating_add(ring.pages().len() as u64 * 8),
            )
            .map_err(|_| SnapshotError::NoResources)?;
        srqs.push((
            h,
            Srq {
                srqn: h,
                pd,
                ring,
                max_sge,
                limit,
                broken,
                qp_refs: 0,
                charge,
                // Refused at save while any XRC domain exists (`busy_reason`).
                xrc: None,
            },
        ));
    }
    dev.srqs
        .restore(srqs)
        .map_err(|h| invalid("SRQ handle", h))?;

    r.section(SEC_MR)?;
    let mut slots = Vec::new();
    // `MrTable::alloc` appends a slot only when none is free: never more than MRs + windows.
    let max_slots = dev.config.max_mr.saturating_add(dev.config.max_mw);
    let fast_reg_max = dev.config.max_fast_reg_page_list_len;
    for _ in 0..r.count_at_most(2, max_slots)? {
        let variant = r.u8()?;
        let kind = r.u8()?;
        if kind == 0 {
            slots.push((variant, None));
            continue;
        }
        let key = r.u32()?;
        let pd = r.u32()?;
        let access = r.u32()?;
        let iova = r.u64()?;
        let length = r.u64()?;
        if !dev.pds.contains(pd) {
            return Err(invalid("MR's PD", pd));
        }
        let kind = match kind {
            MR_PAGE_LIST => {
                let page_shift = r.u32()?;
                MrKind::PageList {
                    page_shift,
                    pages: r.pages(VRDMA_CMD_MAX_PAGES)?,
                }
            }
            MR_DMA => MrKind::Dma,
            MR_FAST_REG => {
                let max_pages = r.u32()?;
                // What ALLOC_FAST_REG_MR would have refused on this device (spec §16.5).
                if max_pages > fast_reg_max {
                    return Err(invalid("fast-reg MR max_pages", max_pages));
                }
                let page_shift = r.u32()?;
                let valid = r.bool()?;
                MrKind::FastReg {
                    max_pages,
                    page_shift,
                    pages: r.pages(fast_reg_max)?,
                    valid,
                }
            }
            MR_ODP => MrKind::Odp(OdpMr::default()),
            MR_IMPLICIT_ODP => MrKind::ImplicitOdp(OdpMr::default()),
            k => return Err(invalid("MR kind", k)),
        };
        slots.push((
            variant,
            Some(Mr {
                key,
                pd,
                access,
                iova,
                length,
                kind,
            }),
        ));
    }
    let max_mr_size = dev.config.max_mr_size;
    dev.mrs.get_mut().restore(slots, max_mr_size)?;

    r.section(SEC_QP)?;
    // The GSI QP does not count against max_qp.
    for _ in 0..r.count_at_most(64, dev.config.max_qp.saturating_add(1))? {
        let qp = get_qp(&mut r, dev)?;
        let (qpn, srqn) = (qp.qpn, qp.srqn);
        // `get_qp` refused a QPN that is taken; the table makes room itself.
        if !dev.qps.insert(qp) {
            return Err(invalid("QPN", qpn));
        }
        if let Some(s) = srqn.and_then(|s| dev.srqs.get_mut(s)) {
            s.qp_refs += 1;
        }
        // Arm the restored retransmission / RNR deadlines (transport/timers.rs).
        crate::transport::timers::note_req(dev, qpn);
    }
    if r.pos != r.buf.len() {
        return Err(SnapshotError::Trailing(r.buf.len() - r.pos));
    }
    Ok(())
}
