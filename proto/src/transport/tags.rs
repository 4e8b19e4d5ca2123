//! The tags of a run of reliable messages of one service, held as one value where the
//! sender's tags allow it: all equal, or counting up by one (as every sender here numbers its
//! messages). A queue entry holding a group of messages and an unacknowledged frame's record
//! both keep their messages' tags this way, so neither needs a record per message.

/// The tags of `len` messages: `first` for all of them (step 0), or `first`, `first + 1`, ...
/// (step 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagRun {
    first: u64,
    len: u32,
    step: u8,
}

impl TagRun {
    /// One message's tag.
    #[inline]
    pub fn one(tag: u64) -> TagRun {
        TagRun {
            first: tag,
            len: 1,
            step: 0,
        }
    }

    /// How many messages.
    #[allow(clippy::len_without_is_empty)] // a run always has a message
    #[inline]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// The first message's tag.
    #[inline]
    pub fn first(&self) -> u64 {
        self.first
    }

    /// Message `k`'s tag.
    #[inline]
    pub fn tag(&self, k: u32) -> u64 {
        self.first.wrapping_add(u64::from(self.step) * u64::from(k))
    }

    /// The last message's tag.
    #[inline]
    pub fn last(&self) -> u64 {
        self.tag(self.len - 1)
    }

    /// Every tag, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len).map(|k| self.tag(k))
    }

    /// These tags followed by `next`'s, if they are one run.
    // Inlined always: it runs on every send, and a call cost as much as the comparison.
    #[inline(always)]
    pub fn then(&self, next: TagRun) -> Option<TagRun> {
        let gap = next.first.wrapping_sub(self.last());
        let step = if self.len > 1 {
            self.step
        } else if next.len > 1 {
            next.step
        } else if gap <= 1 {
            gap as u8
        } else {
            return None;
        };
        if gap != u64::from(step) || (next.len > 1 && next.step != step) {
            return None;
        }
        Some(TagRun {
            first: self.first,
            len: self.len.checked_add(next.len)?,
            step,
        })
    }

    /// These tags followed by one message's `tag`, if they are one run: [`TagRun::then`]
    /// for the case every small message's send meets.
    #[inline(always)]
    pub fn then_one(&self, tag: u64) -> Option<TagRun> {
        let gap = tag.wrapping_sub(self.last());
        let step = if self.len > 1 {
            self.step
        } else if gap <= 1 {
            gap as u8
        } else {
            return None;
        };
        (gap == u64::from(step)).then_some(TagRun {
            first: self.first,
            len: self.len.checked_add(1)?,
            step,
        })
    }

    /// The first `k` tags (`0 < k <= len`).
    #[inline]
    pub fn head(&self, k: u32) -> TagRun {
        TagRun {
            len: k,
            step: if k > 1 { self.step } else { 0 },
            ..*self
        }
    }

    /// The tags after the first `k` (`k < len`).
    #[inline]
    pub fn tail(&self, k: u32) -> TagRun {
        let len = self.len - k;
        TagRun {
            first: self.tag(k),
            len,
            step: if len > 1 { self.step } else { 0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_split_and_list_their_tags() {
        let a = TagRun::one(7);
        let ab = a.then(TagRun::one(8)).unwrap();
        assert_eq!(ab.iter().collect::<Vec<_>>(), [7, 8]);
        assert_eq!(
            ab.then(TagRun::one(8)),
            None,
            "a step of 0 after a step of 1"
        );
        let abc = ab.then(TagRun::one(9)).unwrap();
        assert_eq!((abc.len(), abc.last()), (3, 9));
        assert_eq!(abc.head(2).iter().collect::<Vec<_>>(), [7, 8]);
        assert_eq!(abc.tail(2), TagRun::one(9));
        let same = TagRun::one(4).then(TagRun::one(4)).unwrap();
        assert_eq!(same.iter().collect::<Vec<_>>(), [4, 4]);
        assert_eq!(TagRun::one(4).then(TagRun::one(6)), None);
        assert_eq!(TagRun::one(4).then(TagRun::one(3)), None);
        assert_eq!(
            abc.then(TagRun::one(10).then(TagRun::one(11)).unwrap())
                .map(|r| r.len()),
            Some(5)
        );
    }

    #[test]
    fn joining_one_tag_is_joining_a_run_of_one() {
        let runs = [
            TagRun::one(7),
            TagRun::one(u64::MAX),
            TagRun::one(4).then(TagRun::one(4)).unwrap(),
            TagRun::one(7).then(TagRun::one(8)).unwrap(),
            TagRun::one(u64::MAX).then(TagRun::one(0)).unwrap(),
        ];
        for r in runs {
            for d in [0u64, 1, 2, u64::MAX] {
                let tag = r.last().wrapping_add(d);
                assert_eq!(
                    r.then_one(tag),
                    r.then(TagRun::one(tag)),
                    "{r:?} then {tag}"
                );
            }
        }
    }
}
