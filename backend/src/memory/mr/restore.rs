//! Restoring the MR table from a migration stream (spec §17.3): the saved slots, and the checks
//! an untrusted saved MR must pass before it is installed.

use super::*;

impl MrTable {
    /// Every slot past the reserved slot 0, with its key variant and MR (migration, spec §17.3).
    /// Windows are not migrated (the caller refuses to save while any exists).
    pub fn saved_slots(&self) -> impl Iterator<Item = (u32, u8, Option<&Mr>)> {
        self.slots
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, s)| (i as u32, s.variant, s.mr.as_ref()))
    }

    /// Fill an empty table from migrated slots `(variant, mr)` for indices 1, 2, ... (spec
    /// §17.3). Each MR is checked like a new registration of its kind except against guest
    /// memory (the destination has no memory table yet), and charged; ODP MRs come back with no
    /// resident chunk (they fault again). On error the table is left empty.
    pub fn restore(
        &mut self,
        saved: Vec<(u8, Option<Mr>)>,
        max_mr_size: u64,
    ) -> Result<(), MrError> {
        self.clear();
        let r = self.restore_inner(saved, max_mr_size);
        if r.is_err() {
            self.clear();
            self.slots.truncate(1);
            self.free.clear();
        }
        r
    }

    fn restore_inner(
        &mut self,
        saved: Vec<(u8, Option<Mr>)>,
        max_mr_size: u64,
    ) -> Result<(), MrError> {
        if saved.len() as u64 > u64::from(MAX_MR_INDEX) {
            return Err(MrError::NoResources);
        }
        self.slots.truncate(1);
        self.free.clear();
        for (i, (variant, mr)) in saved.into_iter().enumerate() {
            let idx = i as u32 + 1;
            let mut slot = Slot {
                variant,
                ..Default::default()
            };
            if let Some(mr) = mr {
                if mr.key != (idx << 8) | u32::from(variant) {
                    return Err(MrError::InvalidKey(mr.key));
                }
                Self::check_saved(&mr, max_mr_size)?;
                if self.count >= self.max_mr {
                    return Err(MrError::NoResources);
                }
                let pages = Self::pages_of(&mr);
                if !self.pages_fit(pages, 0) {
                    return Err(MrError::NoResources);
                }
                slot.charge = self.charge(pages)?;
                self.count += 1;
                self.pages_held += pages;
                slot.mr = Some(mr);
            } else {
                self.free.push_back(idx);
            }
            self.slots.push(slot);
        }
        Ok(())
    }

    /// The checks of REG_MR / REG_DMA_MR / ALLOC_FAST_REG_MR / REG_ODP_MR for a migrated MR,
    /// without the guest-memory ones.
    fn check_saved(mr: &Mr, max_mr_size: u64) -> Result<(), MrError> {
        let geometry = |page_shift: u32, pages: &[u64], iova: u64, length: u64| {
            if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift) {
                return Err(MrError::Invalid("page_shift"));
            }
            iova.checked_add(length)
                .ok_or(MrError::Invalid("iova + length overflows"))?;
            let ps = 1u64 << page_shift;
            let need = ((iova & (ps - 1)) + length).div_ceil(ps);
            if need > pages.len() as u64 || pages.iter().any(|p| p & (ps - 1) != 0) {
                return Err(MrError::Invalid("page list does not cover the MR"));
            }
            Ok(())
        };
        if mr.access & VRDMA_ACCESS_FLUSH_PERSISTENT != 0 {
            return Err(MrError::NotSupported);
        }
        match &mr.kind {
            MrKind::PageList { page_shift, pages } => {
                if mr.length > max_mr_size
                    || pages.len() as u64 > u64::from(vrdma_spec::VRDMA_CMD_MAX_PAGES)
                {
                    return Err(MrError::Invalid("page-list MR too large"));
                }
                geometry(*page_shift, pages, mr.iova, mr.length)
            }
            MrKind::Dma => Ok(()),
            MrKind::FastReg {
                max_pages,
                page_shift,
                pages,
                valid,
            } => {
                if *max_pages == 0 || pages.len() as u64 > u64::from(*max_pages) {
                    return Err(MrError::Invalid("max_num_sg"));
                }
                if *valid {
                    geometry(*page_shift, pages, mr.iova, mr.length)
                } else {
                    Ok(())
                }
            }
            MrKind::Odp(_) => {
                if mr.length == 0 || mr.length > max_mr_size {
                    return Err(MrError::Invalid("ODP MR length"));
                }
                mr.iova
                    .checked_add(mr.length)
                    .map(|_| ())
                    .ok_or(MrError::Invalid("iova + length overflows"))
            }
            MrKind::ImplicitOdp(_) => {
                if mr.iova != 0 || mr.length != u64::MAX {
                    return Err(MrError::Invalid("implicit MR geometry"));
                }
                Ok(())
            }
            MrKind::Window(_) => Err(MrError::NotSupported),
        }
    }
}
