//! Fabric segments (segmentation offload between the devices of one daemon, spec §16.2 rule 6):
//! consecutive RoCEv2 frames of one QP (the request packets of a multi-packet message, or the
//! response packets of a multi-packet READ) travel through the fabric as ONE buffer, so a
//! 64 KiB message costs one queue push, one wake-up and one buffer moved instead of sixteen.
//!
//! A segment is fabric-internal and never leaves the process: the fabric splits it into its
//! standard frames (software GSO) before an uplink or the capture sees it, and only an engine
//! whose port says so (`IcrcOffload::segments`) sends or receives one. Every frame inside is a
//! complete standard RoCEv2 frame (headers, payload, pad, ICRC field), built by the ordinary
//! builder: the receiving engine handles them one by one exactly as if they had arrived apart,
//! so PSN checks, ACK coalescing, RNR, retransmission and every IBTA rule stay per path-MTU
//! packet. Layout:
//!
//! ```text
//! 0..12   destination and source MAC: those of every frame inside (the switch decides on them)
//! 12..14  number of frames (big-endian, 1..=MAX_FRAMES)
//! then per frame: length (u16 big-endian), the frame (its first 12 bytes = bytes 0..12 above)
//! ```
//!
//! Nothing in a segment's bytes says it is one: segment-ness travels beside the buffer, out of
//! band (the engine hands one to `Uplink::send_segment`, the fabric queues it with a segment
//! mark, `RxFrame::segment` tells the receiving engine). Every other buffer on every path (a
//! guest's netdev frame, an uplink's frame, a capture) is an ordinary frame whatever its
//! EtherType or payload, so a guest may use any EtherType and nothing from outside the
//! process can be taken for a segment. [`Segment::parse`] still checks every length of a
//! buffer marked as one, so a malformed buffer is refused, never over-read.
//!
//! By reference (stage 2, "one copy"): a segment may travel with [`PayloadRefs`] beside it (out
//! of band too, a Rust object, never bytes): then the payload area of each frame it names is
//! NOT written in the buffer (it holds whatever the reused buffer held) and the payload stays
//! in the sending guest's memory until the receiving engine copies it from there straight into
//! its own guest memory. Wherever such a segment must become bytes (an uplink, the capture, a
//! port without segments, a loopback, a frame the engine does not take), [`materialize`]
//! gathers each payload into its place first, which gives exactly the frames a copying writer
//! would have built. Reading a reference goes through the sender's DMA fence
//! (`memory::fence`): a stale one fails and the segment (or packet) is lost.

/// A by-reference payload could not be read: the sender fenced it (DEREG_MR, invalidation,
/// reset, SET_MEM_TABLE, suspend: spec §16.2 rule 6) or its memory is gone. The packet is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale payload reference")]
pub struct StaleRef;

/// The payloads of a by-reference segment's frames, held in the sender's memory (see the module
/// documentation). Made only by a device's transmit path; type-erased here so the layers that
/// move segments (uplink, fabric) need not know guest memory.
pub trait PayloadRefs: std::fmt::Debug + Send + Sync + std::any::Any {
    /// Where frame `frame`'s payload belongs in the segment buffer (byte offset, length) if it
    /// is held by reference; `None` if the frame carries its payload in the buffer.
    fn place(&self, frame: usize) -> Option<(usize, usize)>;

    /// Read frame `frame`'s payload: `sink(src, off, n)` for each piece in order (`src` valid
    /// for reads of `n` bytes during the call only; `off` the piece's offset in the payload),
    /// all under the sender's fence. `Err` (nothing or only a part handed to `sink`): stale.
    fn read(
        &self,
        frame: usize,
        sink: &mut dyn FnMut(*const u8, usize, usize),
    ) -> Result<(), StaleRef>;

    /// Done with it (consumed, materialized or dropped): an implementation may keep it for
    /// reuse (no allocation per segment). The default frees it.
    fn recycle(self: Box<Self>) {}

    /// For the implementation that made it, to add frames while the segment is being built.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// A segment's by-reference payloads, as they travel beside it.
pub type SegRefs = Box<dyn PayloadRefs>;

/// Write the by-reference payloads of `refs` into their places in `seg` (the buffer of the
/// segment they belong to), making it the segment a copying writer would have built. False if
/// a reference is stale or a place is outside the buffer: the segment must then be dropped.
pub fn materialize(seg: &mut [u8], refs: &dyn PayloadRefs) -> bool {
    for frame in 0..MAX_FRAMES {
        let Some((off, len)) = refs.place(frame) else {
            continue;
        };
        let Some(dst) = off.checked_add(len).and_then(|e| seg.get_mut(off..e)) else {
            return false;
        };
        let dst = dst.as_mut_ptr();
        let mut ok = true;
        let r = refs.read(frame, &mut |src, o, n| {
            if o.checked_add(n).is_some_and(|e| e <= len) {
                // SAFETY: `dst + o .. + n` lies inside the slice of `seg` taken above (checked
                // just now); `src` is valid for `n` bytes during this call (`PayloadRefs::read`)
                // and is guest memory, which never overlaps a host buffer. Raw copies only: the
                // guest may change its bytes meanwhile, we get some values, never UB.
                unsafe { std::ptr::copy_nonoverlapping(src, dst.add(o), n) };
            } else {
                ok = false;
            }
        });
        if r.is_err() || !ok {
            return false;
        }
    }
    true
}

/// Bytes before the first frame record.
pub const HEADER_LEN: usize = 14;
/// Most frames in one segment.
pub const MAX_FRAMES: usize = 64;
/// Most bytes of one segment: the 16 path-MTU-4096 packets of a 64 KiB message fit in one
/// (16 x ~4.2 KiB); small enough that a segment buffer costs about what a 64 KiB receive
/// buffer does.
pub const MAX_BYTES: usize = 72 << 10;
/// Bytes of the length before each frame.
const RECORD_LEN: usize = 2;
/// Room a frame's headers can take beyond its payload (Ethernet + VLAN + IPv6 + UDP + BTH +
/// the largest extension headers + pad + ICRC), for [`SegmentWriter::fits`].
const MAX_HEADERS: usize = 160;

/// The most bytes a request frame with `payload_len` bytes of payload takes (for
/// [`SegmentWriter::push_with`]'s `max_len`).
pub fn max_frame_len(payload_len: usize) -> usize {
    payload_len.saturating_add(MAX_HEADERS)
}

/// How many standard frames a received or sent buffer stands for: a segment's count (if it
/// parses) when `segment` (the buffer's out-of-band mark), else 1.
pub fn frame_count(buf: &[u8], segment: bool) -> usize {
    if !segment {
        return 1;
    }
    Segment::parse(buf).map_or(1, |s| s.count())
}

/// A validated segment (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    buf: &'a [u8],
    count: usize,
}

impl<'a> Segment<'a> {
    /// Check the layout of a buffer marked as a segment: a count of 1..=MAX_FRAMES, records that exactly fill the
    /// buffer, and frames that each have an Ethernet header equal to the segment's addresses.
    /// `None` for anything else.
    pub fn parse(buf: &'a [u8]) -> Option<Segment<'a>> {
        if buf.len() < HEADER_LEN || buf.len() > MAX_BYTES {
            return None;
        }
        let count = usize::from(u16::from_be_bytes([buf[12], buf[13]]));
        if count == 0 || count > MAX_FRAMES {
            return None;
        }
        let macs = &buf[..12];
        let mut at = HEADER_LEN;
        for _ in 0..count {
            let len_bytes = buf.get(at..at + RECORD_LEN)?;
            let len = usize::from(u16::from_be_bytes([len_bytes[0], len_bytes[1]]));
            let frame = buf.get(at + RECORD_LEN..at + RECORD_LEN + len)?;
            if frame.len() < 14 || &frame[..12] != macs {
                return None;
            }
            at += RECORD_LEN + len;
        }
        (at == buf.len()).then_some(Segment { buf, count })
    }

    /// Number of frames.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The frames, in order.
    pub fn frames(&self) -> Frames<'a> {
        Frames {
            buf: self.buf,
            at: HEADER_LEN,
            left: self.count,
        }
    }
}

/// Iterator over a [`Segment`]'s frames.
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    buf: &'a [u8],
    at: usize,
    left: usize,
}

impl<'a> Iterator for Frames<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        // Validated by `Segment::parse`; `get` keeps a wrong count harmless all the same.
        let l = self.buf.get(self.at..self.at + RECORD_LEN)?;
        let len = usize::from(u16::from_be_bytes([l[0], l[1]]));
        let start = self.at + RECORD_LEN;
        let f = self.buf.get(start..start + len)?;
        self.at = start + len;
        self.left -= 1;
        Some(f)
    }
}

/// Builds a segment in a (reused) buffer, frame by frame, each frame written in place by the
/// caller's builder (no copy of a finished frame). The buffer is not zeroed per frame: it grows
/// only where its earlier use did not reach (a reused buffer mostly has the room already), only
/// the bytes a frame's builder writes are used (the builder writes every byte of its frame),
/// and [`SegmentWriter::take`] cuts the buffer to them.
#[derive(Debug, Default)]
pub struct SegmentWriter {
    buf: Vec<u8>,
    used: usize,
    count: usize,
    /// The payloads held by reference (see the module documentation), if any.
    refs: Option<Box<dyn PayloadRefs>>,
}

impl SegmentWriter {
    /// An empty writer around `buf` (its contents are discarded).
    pub fn new(buf: Vec<u8>) -> SegmentWriter {
        SegmentWriter {
            buf,
            used: 0,
            count: 0,
            refs: None,
        }
    }

    /// The by-reference payloads of this segment (the transmit path that made them adds to
    /// them as it writes frames).
    pub fn refs_mut(&mut self) -> &mut Option<Box<dyn PayloadRefs>> {
        &mut self.refs
    }

    /// The offset in the segment buffer of `p`, a pointer into a frame just written (what a
    /// builder's fill got), if it points inside what was written.
    pub fn offset_of(&self, p: *const u8) -> Option<usize> {
        let base = self.buf.as_ptr() as usize;
        let off = (p as usize).checked_sub(base)?;
        (off <= self.used).then_some(off)
    }

    /// Gather every by-reference payload into the buffer (see [`materialize`]) and drop the
    /// references; false if one was stale (the segment must then be dropped: `take` gives it
    /// anyway, the caller decides).
    fn materialize_refs(&mut self) -> bool {
        let Some(r) = self.refs.take() else {
            return true;
        };
        let ok = materialize(&mut self.buf[..self.used], &*r);
        r.recycle();
        ok
    }

    /// [`SegmentWriter::finish`], keeping by-reference payloads by reference when the result is
    /// a segment (then the references come with it, to travel beside it); a single frame is
    /// materialized. `None` if nothing was added, or if a single frame's reference was stale
    /// (then the frame is lost: spec §16.2 rule 6).
    pub fn finish_with_refs(&mut self) -> Option<(Vec<u8>, Option<SegRefs>)> {
        if self.count > 1 {
            let refs = self.refs.take();
            return self.take().map(|b| (b, refs));
        }
        if !self.materialize_refs() {
            self.count = 0;
            self.used = 0;
            return None;
        }
        self.finish().map(|b| (b, None))
    }

    /// Frames written so far.
    pub fn count(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes written so far (header included).
    pub fn len(&self) -> usize {
        self.used
    }

    /// Can a frame with `payload_len` bytes of payload still be added?
    pub fn fits(&self, payload_len: usize) -> bool {
        let used = self.used.max(HEADER_LEN);
        self.count < MAX_FRAMES && used + RECORD_LEN + max_frame_len(payload_len) <= MAX_BYTES
    }

    /// Add one frame of at most `max_len` bytes that `build(room)` writes at the start of
    /// `room` (at least `max_len` bytes), returning its length. `Ok(Some(len))`: added;
    /// `Ok(None)`: refused (the segment is full, or the frame is shorter than an Ethernet header
    /// or addressed otherwise than the first frame); `Err`: the build's error. Either way the
    /// segment is as it was.
    pub fn push_with<E>(
        &mut self,
        max_len: usize,
        build: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<Option<usize>, E> {
        let start = self.used.max(HEADER_LEN) + RECORD_LEN;
        let need = start.saturating_add(max_len);
        if self.count >= MAX_FRAMES || need > MAX_BYTES {
            return Ok(None);
        }
        if self.buf.len() < need {
            // Only bytes no earlier use of the buffer reached are zeroed.
            self.buf.resize(need, 0);
        }
        let Some(room) = self.buf.get_mut(start..) else {
            return Ok(None);
        };
        let len = build(room)?;
        let ok = len >= 14
            && len <= room.len()
            && len <= usize::from(u16::MAX)
            && (self.count == 0 || self.buf[start..start + 12] == self.buf[..12]);
        if !ok {
            return Ok(None);
        }
        if self.count == 0 {
            let (hdr, rest) = self.buf.split_at_mut(HEADER_LEN);
            hdr[..12].copy_from_slice(&rest[RECORD_LEN..RECORD_LEN + 12]);
        }
        self.buf[start - RECORD_LEN..start].copy_from_slice(&(len as u16).to_be_bytes());
        self.count += 1;
        self.buf[12..14].copy_from_slice(&(self.count as u16).to_be_bytes());
        self.used = start + len;
        Ok(Some(len))
    }

    /// The finished segment (`None` if no frame was added), and the writer is empty again.
    pub fn take(&mut self) -> Option<Vec<u8>> {
        if self.count == 0 {
            return None;
        }
        if !self.materialize_refs() {
            // A stale reference: the segment is lost (spec §16.2 rule 6).
            self.count = 0;
            self.used = 0;
            return None;
        }
        let mut b = std::mem::take(&mut self.buf);
        b.truncate(self.used);
        self.count = 0;
        self.used = 0;
        Some(b)
    }

    /// What to send: the segment, or for a single frame that frame alone (moved to the front of
    /// the buffer: one frame gains nothing from a segment, and its receiver need not parse
    /// one). `None` if nothing was added; the writer is empty again. The result is a segment
    /// (to be sent as one, out of band) exactly when [`SegmentWriter::count`] was above 1.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        if self.count != 1 {
            return self.take();
        }
        let start = HEADER_LEN + RECORD_LEN;
        let mut b = self.take()?;
        b.copy_within(start.., 0);
        b.truncate(b.len() - start);
        Some(b)
    }

    /// The buffer back (e.g. for a frame pool), whatever it holds.
    pub fn into_buf(mut self) -> Vec<u8> {
        if let Some(r) = self.refs.take() {
            r.recycle();
        }
        std::mem::take(&mut self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(macs: u8, len: usize, fill: u8) -> Vec<u8> {
        let mut f = vec![macs; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        f.resize(len, fill);
        f
    }

    fn push(w: &mut SegmentWriter, f: &[u8]) -> bool {
        w.push_with(f.len(), |room: &mut [u8]| {
            room[..f.len()].copy_from_slice(f);
            Ok::<usize, ()>(f.len())
        })
        .unwrap()
        .is_some()
    }

    #[test]
    fn frames_come_out_as_they_went_in() {
        let mut w = SegmentWriter::new(vec![0xee; 500]);
        let fs: Vec<Vec<u8>> = (0..5).map(|i| frame(7, 60 + i * 100, i as u8)).collect();
        for f in &fs {
            assert!(push(&mut w, f));
        }
        let seg = w.take().unwrap();
        let s = Segment::parse(&seg).expect("valid");
        assert_eq!(s.count(), 5);
        assert_eq!(frame_count(&seg, true), 5);
        assert_eq!(frame_count(&seg, false), 1, "unmarked, it is one frame");
        assert_eq!(&seg[..12], &fs[0][..12]);
        let back: Vec<&[u8]> = s.frames().collect();
        assert_eq!(back.len(), 5);
        for (a, b) in back.iter().zip(&fs) {
            assert_eq!(a, b);
        }
        assert!(w.take().is_none(), "the writer is empty again");
    }

    #[test]
    fn a_single_frame_leaves_as_itself() {
        let mut w = SegmentWriter::new(vec![0xee; 100]);
        assert!(w.finish().is_none());
        let f = frame(3, 90, 9);
        assert!(push(&mut w, &f));
        assert_eq!(w.finish().unwrap(), f);
        assert!(push(&mut w, &f) && push(&mut w, &f));
        let two = w.finish().unwrap();
        assert_eq!(Segment::parse(&two).unwrap().count(), 2);
    }

    #[test]
    fn a_frame_of_other_addresses_or_a_failed_build_is_refused() {
        let mut w = SegmentWriter::default();
        assert!(push(&mut w, &frame(1, 100, 0)));
        assert!(!push(&mut w, &frame(2, 100, 0)), "other MACs");
        assert!(!push(&mut w, &frame(1, 10, 0)), "shorter than Ethernet");
        let r = w.push_with(100, |room: &mut [u8]| {
            room[..99].fill(1);
            Err::<usize, u8>(5)
        });
        assert_eq!(r, Err(5));
        let seg = w.take().unwrap();
        let s = Segment::parse(&seg).unwrap();
        assert_eq!(s.count(), 1);
        assert_eq!(s.frames().next().unwrap(), &frame(1, 100, 0)[..]);
    }

    #[test]
    fn bounded_in_frames_and_bytes() {
        let mut w = SegmentWriter::default();
        for _ in 0..MAX_FRAMES {
            assert!(push(&mut w, &frame(1, 20, 0)));
        }
        assert!(!w.fits(0));
        assert!(!push(&mut w, &frame(1, 20, 0)));
        let mut w = SegmentWriter::default();
        assert!(w.fits(9000));
        while w.fits(9000) {
            assert!(push(&mut w, &frame(1, 9000, 0)));
        }
        assert!(w.len() <= MAX_BYTES);
        assert!(Segment::parse(&w.take().unwrap()).is_some());
    }

    #[test]
    fn malformed_segments_are_refused_not_over_read() {
        let mut w = SegmentWriter::default();
        push(&mut w, &frame(1, 100, 3));
        push(&mut w, &frame(1, 50, 4));
        let good = w.take().unwrap();
        assert!(Segment::parse(&good).is_some());
        // Every truncation, and every extension, is refused.
        for n in 0..good.len() {
            assert!(Segment::parse(&good[..n]).is_none(), "truncated to {n}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(Segment::parse(&long).is_none());
        // Counts 0, too many, one more than present.
        for c in [0u16, MAX_FRAMES as u16 + 1, 3] {
            let mut b = good.clone();
            b[12..14].copy_from_slice(&c.to_be_bytes());
            assert!(Segment::parse(&b).is_none(), "count {c}");
        }
        // A record length past the end; a frame whose addresses differ.
        let mut b = good.clone();
        b[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(Segment::parse(&b).is_none());
        let mut b = good.clone();
        b[HEADER_LEN + 2] ^= 1;
        assert!(Segment::parse(&b).is_none());
        // Not a segment at all.
        assert_eq!(frame_count(&frame(1, 100, 0), true), 1);
        assert!(Segment::parse(&frame(1, 100, 0)).is_none());
    }
}
