//! Registration and invalidation (spec §11.8, §12): REG_MR / REREG_MR page lists, DMA MRs,
//! fast-reg MRs and their REG_MR WQE, ODP MRs, DEREG_MR, LOCAL_INV / SEND_WITH_INV.

use super::*;

impl MrTable {
    /// REG_MR: a page-list MR. Validates flags, geometry and every page against guest memory.
    pub fn reg_page_list(&mut self, spec: &PageListSpec, max_mr_size: u64) -> Result<u32, MrError> {
        let (mr, charge) = self.page_list_mr(spec, max_mr_size, 0)?;
        self.alloc(mr, charge)
    }

    /// REREG_MR: replace PD, access, range and page list of the page-list MR `key`, keeping the
    /// key. Validation is REG_MR's; on error the MR is unchanged. Accesses resolve the key again
    /// for every step, so nothing can still use the old translation after this returns.
    pub fn rereg_page_list(
        &mut self,
        key: u32,
        spec: &PageListSpec,
        max_mr_size: u64,
    ) -> Result<(), MrError> {
        if !matches!(self.get(key)?.kind, MrKind::PageList { .. }) {
            return Err(MrError::NotSupported);
        }
        // Like the page count, the budget takes the current list as given back first (spec
        // §11.8): only what the new list adds is charged.
        let idx = key_index(key) as usize;
        let held = self.slots[idx].charge.bytes();
        let (mut mr, extra) = self.page_list_mr(spec, max_mr_size, held)?;
        let (add, release) = (Self::pages_of(&mr), Self::pages_of(self.get(key)?));
        if !self.pages_fit(add, release) {
            return Err(MrError::NoResources);
        }
        mr.key = key;
        *self.get_mut(key)? = mr;
        let charge = &mut self.slots[idx].charge;
        charge.shrink(held.saturating_sub(Self::charge_of(add)));
        charge.absorb(extra);
        self.pages_held = self.pages_held - release + add;
        self.fence_slot(key);
        Ok(())
    }

    /// A checked page-list MR, not yet in the table (key 0), and the charge for it beyond the
    /// `credit` bytes the caller already holds for it.
    fn page_list_mr(
        &self,
        spec: &PageListSpec,
        max_mr_size: u64,
        credit: u64,
    ) -> Result<(Mr, Charge), MrError> {
        let PageListSpec {
            pd,
            access,
            iova,
            length,
            page_shift,
            pages,
        } = *spec;
        check_access_flags(access)?;
        if access & VRDMA_ACCESS_ON_DEMAND != 0 {
            return Err(MrError::Invalid("ON_DEMAND on a page-list MR"));
        }
        if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift) {
            return Err(MrError::Invalid("page_shift"));
        }
        if length > max_mr_size {
            return Err(MrError::Invalid("length > max_mr_size"));
        }
        iova.checked_add(length)
            .ok_or(MrError::Invalid("iova + length overflows"))?;
        let ps = 1u64 << page_shift;
        let first_off = iova & (ps - 1);
        let need = (first_off + length).div_ceil(ps);
        if pages.len() as u64 != need {
            return Err(MrError::Invalid(
                "npages does not match iova/length/page_shift",
            ));
        }
        // Spec §11.1: no command carries more (the control queue cannot deliver more either;
        // checked here too so no other caller can store a longer list).
        if need > u64::from(vrdma_spec::VRDMA_CMD_MAX_PAGES) {
            return Err(MrError::Invalid("npages > VRDMA_CMD_MAX_PAGES"));
        }
        self.check_pages(pages, page_shift)?;
        let charge = self
            .budget
            .try_charge(Self::charge_of(need).saturating_sub(credit))
            .map_err(|_| MrError::NoResources)?;
        let mr = Mr {
            key: 0,
            pd,
            access,
            iova,
            length,
            kind: MrKind::PageList {
                page_shift,
                pages: pages.to_vec(),
            },
        };
        Ok((mr, charge))
    }

    fn check_pages(&self, pages: &[u64], page_shift: u32) -> Result<(), MrError> {
        let ps = 1u64 << page_shift;
        for &p in pages {
            if p & (ps - 1) != 0 {
                return Err(MrError::Invalid(
                    "page address not aligned to the page size",
                ));
            }
            if !self.mem.check_range(p, ps) {
                return Err(MrError::BadAddress { gpa: p });
            }
        }
        Ok(())
    }

    /// REG_DMA_MR: iova == GPA; remote access bits are refused (`BadAccess` → STATUS_ACCESS).
    pub fn reg_dma(&mut self, pd: u32, access: u32) -> Result<u32, MrError> {
        check_access_flags(access)?;
        if access & (ACCESS_REMOTE | VRDMA_ACCESS_ON_DEMAND) != 0 {
            return Err(MrError::BadAccess(access));
        }
        let charge = self.charge(0)?;
        self.alloc(
            Mr {
                key: 0,
                pd,
                access,
                iova: 0,
                length: u64::MAX,
                kind: MrKind::Dma,
            },
            charge,
        )
    }

    /// ALLOC_FAST_REG_MR: empty (invalid) MR with room for `max_pages` pages.
    pub fn alloc_fast_reg(
        &mut self,
        pd: u32,
        max_pages: u32,
        max_list: u32,
    ) -> Result<u32, MrError> {
        if max_pages == 0 || max_pages > max_list {
            return Err(MrError::Invalid("max_num_sg"));
        }
        // The capacity is charged now: FRWR fills it from the data path, which cannot fail a
        // WQE for want of memory the MR was promised.
        let charge = self.charge(u64::from(max_pages))?;
        self.alloc(
            Mr::unmapped(
                pd,
                MrKind::FastReg {
                    max_pages,
                    page_shift: MIN_PAGE_SHIFT,
                    pages: Vec::new(),
                    valid: false,
                },
            ),
            charge,
        )
    }

    /// REG_ODP_MR (explicit) or REG_IMPLICIT_MR (`implicit`: iova must be 0 and length u64::MAX).
    pub fn reg_odp(
        &mut self,
        pd: u32,
        access: u32,
        iova: u64,
        length: u64,
        implicit: bool,
        max_mr_size: u64,
    ) -> Result<u32, MrError> {
        if (implicit && !self.odp.config.implicit) || (!implicit && !self.odp.config.enabled) {
            return Err(MrError::NotSupported);
        }
        check_access_flags(access)?;
        if implicit {
            if iova != 0 || length != u64::MAX {
                return Err(MrError::Invalid(
                    "implicit MR must be iova 0, length u64::MAX",
                ));
            }
        } else {
            if length == 0 || length > max_mr_size {
                return Err(MrError::Invalid("ODP MR length"));
            }
            iova.checked_add(length)
                .ok_or(MrError::Invalid("iova + length overflows"))?;
        }
        let odp = OdpMr::default();
        let charge = self.charge(0)?;
        self.alloc(
            Mr {
                key: 0,
                pd,
                access: access | VRDMA_ACCESS_ON_DEMAND,
                iova,
                length,
                kind: if implicit {
                    MrKind::ImplicitOdp(odp)
                } else {
                    MrKind::Odp(odp)
                },
            },
            charge,
        )
    }

    /// DEREG_MR. The slot's variant is kept so the old key stays invalid after reuse.
    pub fn dereg(&mut self, key: u32) -> Result<(), MrError> {
        self.get(key)?;
        let idx = key_index(key);
        let mr = self.slots[idx as usize].mr.take();
        self.slots[idx as usize].charge = Charge::default();
        // Windows bound to the MR stay bound to its (now stale) key: their accesses fail
        // (spec §12.8), and their unbinding no longer counts against this slot.
        self.slots[idx as usize].bound_mws = 0;
        if let Some(mr) = mr {
            self.pages_held -= Self::pages_of(&mr);
            self.odp.forget_mr(&mr);
        }
        self.free.push_back(idx);
        self.count -= 1;
        self.fence_slot(key);
        Ok(())
    }

    /// REG_MR WQE (fast registration) executed by the requester. `pd` is the QP's PD; `reg.key`
    /// the new key from the WQE (index must name a fast-reg MR of that PD, which must be
    /// invalid); the page list (`page_list_len` u64 GPAs at `page_list_addr`) is read from guest
    /// memory.
    pub fn fast_register(&mut self, pd: u32, reg: &FastReg) -> Result<(), MrError> {
        let FastReg {
            key,
            access,
            iova,
            length,
            page_shift,
            page_list_addr,
            page_list_len,
        } = *reg;
        check_access_flags(access)?;
        if access & VRDMA_ACCESS_ON_DEMAND != 0 {
            return Err(MrError::BadAccess(access));
        }
        let idx = key_index(key) as usize;
        let slot_mr = self
            .slots
            .get(idx)
            .filter(|_| idx != 0)
            .and_then(|s| s.mr.as_ref())
            .ok_or(MrError::InvalidKey(key))?;
        if slot_mr.pd != pd {
            return Err(MrError::WrongPd { key, pd });
        }
        let max_pages = match &slot_mr.kind {
            MrKind::FastReg {
                valid: false,
                max_pages,
                ..
            } => *max_pages,
            _ => return Err(MrError::InvalidOp(key)),
        };
        if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift) {
            return Err(MrError::Invalid("page_shift"));
        }
        if page_list_len > max_pages {
            return Err(MrError::Invalid("page_list_len > max_num_sg"));
        }
        iova.checked_add(length)
            .ok_or(MrError::Invalid("iova + length overflows"))?;
        let ps = 1u64 << page_shift;
        let first_off = iova & (ps - 1);
        let need = (first_off + length).div_ceil(ps);
        if need > page_list_len as u64 {
            return Err(MrError::Invalid("length exceeds the page list"));
        }
        let mut pages = Vec::with_capacity(page_list_len as usize);
        for i in 0..page_list_len as u64 {
            let a = page_list_addr
                .checked_add(i * 8)
                .ok_or(MrError::BadAddress {
                    gpa: page_list_addr,
                })?;
            let p = self
                .mem
                .read_u64(a)
                .map_err(|_| MrError::BadAddress { gpa: a })?;
            pages.push(p);
        }
        self.check_pages(&pages, page_shift)?;
        let variant = key_variant(key);
        let slot = &mut self.slots[idx];
        slot.variant = variant;
        if let Some(mr) = slot.mr.as_mut() {
            mr.key = key;
            mr.access = access;
            mr.iova = iova;
            mr.length = length;
            mr.kind = MrKind::FastReg {
                max_pages,
                page_shift,
                pages,
                valid: true,
            };
        }
        // The MR was invalid (so already fenced); fenced again so the rule reads "every
        // change of a slot's translation moves its generation" (spec §16.2 rule 6).
        self.fence_slot(key);
        Ok(())
    }

    /// LOCAL_INV WQE: invalidate the fast-reg MR or the type 2B window named by exactly `key` in
    /// `pd` (spec §6.1, §12.8).
    pub fn local_invalidate(&mut self, key: u32, pd: u32) -> Result<(), MrError> {
        self.invalidate(key, pd, None)
    }

    /// SEND_WITH_INV arriving on QP `qpn` of PD `pd`: as LOCAL_INV, and a type 2B window must be
    /// associated with `qpn` (spec §12.8, §14.6).
    pub fn remote_invalidate(&mut self, key: u32, pd: u32, qpn: u32) -> Result<(), MrError> {
        self.invalidate(key, pd, Some(qpn))
    }

    fn invalidate(&mut self, key: u32, pd: u32, qpn: Option<u32>) -> Result<(), MrError> {
        if self.entry(key)?.is_window() {
            return self.invalidate_window(key, pd, qpn);
        }
        // IBTA 10.6.7 (as Linux rxe): a region with bound windows cannot be invalidated.
        if self.slots[key_index(key) as usize].bound_mws > 0 {
            return Err(MrError::InvalidOp(key));
        }
        let mr = self.get_mut(key)?;
        if mr.pd != pd {
            return Err(MrError::WrongPd { key, pd });
        }
        match &mut mr.kind {
            MrKind::FastReg { valid, pages, .. } => {
                *valid = false;
                pages.clear();
                self.fence_slot(key);
                Ok(())
            }
            _ => Err(MrError::InvalidOp(key)),
        }
    }
}
