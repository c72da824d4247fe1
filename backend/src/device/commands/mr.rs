//! Memory commands (spec §11.8, §12): REG_MR, REREG_MR, REG_DMA_MR, ALLOC_FAST_REG_MR,
//! REG_ODP_MR / REG_IMPLICIT_MR, DEREG_MR, ALLOC_MW / DEALLOC_MW, ADVISE_MR and the ODP
//! commands (ODP_PAGE_RESP, ODP_INVALIDATE).

use super::*;

impl Device {
    pub(super) fn put_key(resp: &mut Vec<u8>, key: u32) {
        put(
            resp,
            &VrdmaRespRegMr {
                lkey: key,
                rkey: key,
            },
        );
    }

    /// REG_MR and the other commands that add an MR or a window (REG_DMA_MR,
    /// ALLOC_FAST_REG_MR, REG_ODP_MR / REG_IMPLICIT_MR, ALLOC_MW) take a free slot under the MR
    /// table's write lock: they run on the shared device (`handle_shared`), beside the
    /// workers, waiting only for the translations in progress. What takes a permission away
    /// (DEREG_MR, REREG_MR, DEALLOC_MW, ODP_INVALIDATE) runs there too, then waits for the
    /// units of work in flight ([`Device::fence_local_copies`]): a worker may be copying
    /// through a range it translated before. ODP_PAGE_RESP runs there too unless its install
    /// reclaims a chunk ([`Device::cmd_odp_page_resp_shared`]).
    pub(super) fn cmd_reg_mr(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, rest) = parse::<VrdmaCmdRegMr>(req)?;
        let pages = page_list(rest, c.npages)?;
        self.pd_exists(c.pdn)?;
        let spec = PageListSpec {
            pd: c.pdn,
            access: c.access,
            iova: c.iova,
            length: c.length,
            page_shift: c.page_shift,
            pages: &pages,
        };
        let key = self
            .mrs
            .write()
            .reg_page_list(&spec, self.config.max_mr_size)
            .map_err(|e| e.status())?;
        Self::put_key(resp, key);
        Ok(())
    }

    /// Wait until no worker copies through a translation made before the MR table change this
    /// command just made (and released the table's lock after; a refused command changed
    /// nothing and does not wait): the unit fence
    /// (`tables/units.rs`). By-reference readers on other devices have the DMA fence, which
    /// the MR table ran. On the exclusive device it returns at once.
    pub(super) fn fence_local_copies(&self) {
        self.units.wait();
    }

    pub(super) fn cmd_rereg_mr(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, rest) = parse::<VrdmaCmdReregMr>(req)?;
        let pages = page_list(rest, c.npages)?;
        self.mrs.read().get(c.key).map_err(|e| e.status())?;
        self.pd_exists(c.pdn)?;
        let spec = PageListSpec {
            pd: c.pdn,
            access: c.access,
            iova: c.iova,
            length: c.length,
            page_shift: c.page_shift,
            pages: &pages,
        };
        self.mrs
            .write()
            .rereg_page_list(c.key, &spec, self.config.max_mr_size)
            .map_err(|e| e.status())?;
        self.fence_local_copies();
        Self::put_key(resp, c.key);
        Ok(())
    }

    /// The REG_MR-shaped commands without a page list (REG_DMA_MR, ALLOC_FAST_REG_MR, REG_ODP_MR
    /// / REG_IMPLICIT_MR): in an existing PD, `add` makes the MR; its key is the answer.
    fn add_mr(
        &self,
        req: &[u8],
        resp: &mut Vec<u8>,
        add: impl FnOnce(
            &mut crate::memory::MrTable,
            &VrdmaCmdRegMr,
        ) -> Result<u32, crate::memory::MrError>,
    ) -> CmdResult {
        let (c, _) = parse::<VrdmaCmdRegMr>(req)?;
        self.pd_exists(c.pdn)?;
        let key = add(&mut self.mrs.write(), &c).map_err(|e| e.status())?;
        Self::put_key(resp, key);
        Ok(())
    }

    pub(super) fn cmd_reg_dma_mr(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        self.add_mr(req, resp, |mrs, c| mrs.reg_dma(c.pdn, c.access))
    }

    pub(super) fn cmd_alloc_fast_reg(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let max_pages = self.config.max_fast_reg_page_list_len;
        self.add_mr(req, resp, |mrs, c| {
            mrs.alloc_fast_reg(c.pdn, c.npages, max_pages)
        })
    }

    pub(super) fn cmd_reg_odp(&self, req: &[u8], resp: &mut Vec<u8>, implicit: bool) -> CmdResult {
        let max_mr_size = self.config.max_mr_size;
        self.add_mr(req, resp, |mrs, c| {
            mrs.reg_odp(c.pdn, c.access, c.iova, c.length, implicit, max_mr_size)
        })
    }

    pub(super) fn cmd_dereg_mr(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        self.mrs.write().dereg(c.handle).map_err(|e| e.status())?;
        self.fence_local_copies();
        Ok(())
    }

    /// ALLOC_MW (spec §12.8): the response handle is the window's rkey.
    pub(super) fn cmd_alloc_mw(&self, req: &[u8], resp: &mut Vec<u8>) -> CmdResult {
        let (c, _) = parse::<VrdmaCmdAllocMw>(req)?;
        if self.config.max_mw == 0 {
            return Err(VRDMA_STATUS_NOT_SUPPORTED);
        }
        self.pd_exists(c.pdn)?;
        let key = self
            .mrs
            .write()
            .alloc_mw(c.pdn, c.type_)
            .map_err(|e| e.status())?;
        put(resp, &handle(key));
        Ok(())
    }

    /// DEALLOC_MW (spec §12.8).
    pub(super) fn cmd_dealloc_mw(&self, req: &[u8]) -> CmdResult {
        let (c, _) = parse::<VrdmaHandle>(req)?;
        self.mrs
            .write()
            .dealloc_mw(c.handle)
            .map_err(|e| e.status())?;
        self.fence_local_copies();
        Ok(())
    }

    pub(super) fn status(s: u32) -> CmdResult {
        if s == VRDMA_STATUS_OK {
            Ok(())
        } else {
            Err(s)
        }
    }

    /// ADVISE_MR, ODP_PAGE_RESP and ODP_INVALIDATE exist only with VIRTIO_RDMA_F_ODP.
    pub(super) fn odp_commands(&self) -> CmdResult {
        if self.mrs.read().odp_config().enabled {
            Ok(())
        } else {
            Err(VRDMA_STATUS_NOT_SUPPORTED)
        }
    }

    /// ADVISE_MR beside the engine workers (`handle_shared`), under the MR table's write lock:
    /// the page requests it sends and the chunks it marks pending are what a worker's fault
    /// does under the same lock. `None` with F_FLUSH: that advise may be parked, and a caller
    /// of `handle_shared` has no way to park the chain before the completion can come (a
    /// caller that has one uses [`Device::handle_shared_parking`]).
    pub(super) fn cmd_advise_mr_shared(&self, req: &[u8]) -> Option<CmdResult> {
        let c = match parse::<VrdmaCmdAdviseMr>(req) {
            Ok((c, _)) => c,
            Err(s) => return Some(Err(s)),
        };
        if c.flags & VRDMA_ADVISE_F_FLUSH != 0 {
            return None;
        }
        if let Err(s) = self.odp_commands() {
            return Some(Err(s));
        }
        let outcome = self
            .mrs
            .write()
            .odp_advise(c.lkey, c.advice, c.flags, c.iova, c.length);
        match outcome {
            CmdOutcome::Done(s) => Some(Self::status(s)),
            // Only an advise with F_FLUSH parks (`odp_advise`).
            CmdOutcome::Parked(_) => Some(Err(VRDMA_STATUS_INVALID)),
        }
    }

    /// ADVISE_MR on the exclusive device (with F_FLUSH it may park, spec §11.8).
    pub(super) fn cmd_advise_mr(&mut self, req: &[u8]) -> CmdOutcome {
        self.cmd_advise_mr_beside(req)
    }

    /// ADVISE_MR with or without F_FLUSH under the MR table's write lock, on the device held
    /// shared or exclusively. A parked advise completes (`DeviceOutput::command_done`) when
    /// the page requests it waits for end, which takes the same write lock: beside the
    /// workers that may be before the caller has parked the chain, which its caller allows
    /// for ([`Device::handle_shared_parking`]).
    pub(super) fn cmd_advise_mr_beside(&self, req: &[u8]) -> CmdOutcome {
        if let Err(s) = self.odp_commands() {
            return CmdOutcome::Done(s);
        }
        match parse::<VrdmaCmdAdviseMr>(req) {
            Ok((c, _)) => self
                .mrs
                .write()
                .odp_advise(c.lkey, c.advice, c.flags, c.iova, c.length),
            Err(s) => CmdOutcome::Done(s),
        }
    }

    /// ODP_PAGE_RESP beside the engine workers, under the MR table's write lock: the chunk it
    /// installs and the waiters it resumes are what a worker's fault and resumption use under
    /// the same lock, and an install takes no permission away. `Ok(None)` when the install would
    /// reclaim a chunk (a residency budget is full, spec §12.6): that answer runs on the
    /// exclusive device, since its RECLAIM notice, after which the driver may unmap the
    /// victim, must not leave while a unit of work may still copy through the victim.
    pub(super) fn cmd_odp_page_resp_shared(&self, req: &[u8]) -> Result<Option<()>, u32> {
        self.odp_commands()?;
        let (c, rest) = parse::<VrdmaCmdOdpPageResp>(req)?;
        let pages = page_list(rest, c.npages)?;
        self.mrs
            .write()
            .odp_page_resp_cmd(&c, &pages, false)
            .map(Self::status)
            .transpose()
    }

    /// ODP_PAGE_RESP on the exclusive device: an answer whose install reclaims a chunk.
    pub(super) fn cmd_odp_page_resp(&mut self, req: &[u8]) -> CmdResult {
        self.odp_commands()?;
        let (c, rest) = parse::<VrdmaCmdOdpPageResp>(req)?;
        let pages = page_list(rest, c.npages)?;
        let status = self.mrs.get_mut().odp_page_resp_cmd(&c, &pages, true);
        Self::status(status.unwrap_or(VRDMA_STATUS_INVALID))
    }

    pub(super) fn cmd_odp_invalidate(&self, req: &[u8]) -> CmdResult {
        self.odp_commands()?;
        let (c, _) = parse::<VrdmaCmdOdpInvalidate>(req)?;
        let status = self.mrs.write().odp_invalidate(c.mr_key, c.iova, c.length);
        // A refused command changed nothing: no fence to pay.
        Self::status(status)?;
        self.fence_local_copies();
        Ok(())
    }
}
