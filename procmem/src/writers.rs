//! Whom the held writes are for, so that a deferred write that fails is charged to the QPs
//! whose data it was ([`ProcessMemory::set_writer`], [`ProcessMemory::take_failed_writers`]).

use crate::{ProcessMemory, NO_WRITER};

/// Most distinct spans of writers remembered between two flushes; past it a failed flush
/// blames every writer since the last one.
const MAX_WRITER_SPANS: usize = 4096;

/// Who the bytes held for writing came for: spans of remote addresses with the writer's tag
/// (the device names the QP whose packet is being placed), so that a deferred write that
/// fails is charged to the QPs whose data it was.
#[derive(Debug, Default)]
pub(crate) struct Writers {
    /// (start, end, tag), in the order written; contiguous writes of one tag merge.
    spans: Vec<(u64, u64, u32)>,
    /// Every tag seen since the last flush.
    tags: Vec<u32>,
    overflow: bool,
    /// Tags whose writes failed, not taken yet.
    failed: Vec<u32>,
}

impl Writers {
    pub(crate) fn record(&mut self, addr: u64, len: usize, tag: u32) {
        if tag == NO_WRITER {
            return;
        }
        let end = addr.saturating_add(len as u64);
        let room = self.spans.len() < MAX_WRITER_SPANS;
        match self.spans.last_mut() {
            Some((_, e, t)) if *t == tag && *e == addr => *e = end,
            _ if room => self.spans.push((addr, end, tag)),
            _ => self.overflow = true,
        }
        if !self.tags.contains(&tag) {
            self.tags.push(tag);
        }
    }

    /// Charges a failed write of `[addr, addr + len)` to its writers.
    pub(crate) fn fail(&mut self, addr: u64, len: usize) {
        let end = addr.saturating_add(len as u64);
        let Writers {
            spans,
            tags,
            overflow,
            failed,
        } = self;
        let blamed: Vec<u32> = if *overflow {
            tags.clone()
        } else {
            spans
                .iter()
                .filter(|&&(a, e, _)| a < end && addr < e)
                .map(|&(_, _, t)| t)
                .collect()
        };
        for t in blamed {
            if !failed.contains(&t) {
                failed.push(t);
            }
        }
    }

    pub(crate) fn fail_all(&mut self) {
        for t in std::mem::take(&mut self.tags) {
            if !self.failed.contains(&t) {
                self.failed.push(t);
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.spans.clear();
        self.tags.clear();
        self.overflow = false;
    }
}

impl ProcessMemory {
    /// Names whom the next writes are for (the device: the QP whose packet it hands to the
    /// engine), until named again; [`NO_WRITER`] for nobody.
    pub fn set_writer(&mut self, tag: u32) {
        self.writer = tag;
    }

    /// The writers (see [`ProcessMemory::set_writer`]) of deferred writes that failed since
    /// the last call: their data never reached the process.
    pub fn take_failed_writers(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.writers.failed)
    }
}
