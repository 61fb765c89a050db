//! The events streamed transactions inserted, read from pgoutput's insert messages: the seq of
//! each outbox row, so that a commit whose events the relays claimed already wakes nobody.
//!
//! Only the message's first column is read. `seq` is the outbox's first column (its first
//! migration, never edited), and pgoutput sends columns in the table's order, as text unless
//! the subscription asks for binary, which the wake-up does not. Anything else (a publication
//! whose column list leaves `seq` out) reads as unknown, and the commit wakes the relays.

/// The seqs of one or more transactions' outbox inserts, as far as they are known.
#[derive(Debug, Default)]
pub(super) struct Inserted {
    seqs: Vec<i64>,
    /// An insert whose seq could not be read, or more than [`Inserted::KEPT`] of them.
    unknown: bool,
    any: bool,
}

impl Inserted {
    /// Transactions with more inserts are not checked against the claims: the relays are
    /// woken.
    const KEPT: usize = 4096;

    /// Notes one pgoutput message of the transaction.
    pub(super) fn read(&mut self, message: &[u8]) {
        if message.first() != Some(&b'I') {
            return;
        }
        self.any = true;
        match first_column(message) {
            Some(seq) if self.seqs.len() < Self::KEPT => self.seqs.push(seq),
            _ => self.unknown = true,
        }
    }

    /// The seqs so far: none when some are not known.
    pub(super) fn seqs(&self) -> Vec<i64> {
        if self.unknown {
            Vec::new()
        } else {
            self.seqs.clone()
        }
    }

    /// Whether it holds any insert.
    pub(super) fn any(&self) -> bool {
        self.any
    }

    /// Adds another transaction's [`Inserted::take`]: empty, its seqs are not known.
    pub(super) fn add(&mut self, seqs: &[i64]) {
        self.any = true;
        if seqs.is_empty() || self.seqs.len() + seqs.len() > Self::KEPT {
            self.unknown = true;
        } else {
            self.seqs.extend_from_slice(seqs);
        }
    }

    /// The transaction's seqs if it inserted any: empty when some are not known.
    pub(super) fn take(&mut self) -> Option<Vec<i64>> {
        let Self { seqs, unknown, any } = std::mem::take(self);
        any.then(|| if unknown { Vec::new() } else { seqs })
    }
}

/// The first column of an insert message (`I`, relation oid, `N`, column count, then per
/// column its kind, and for text its length and bytes) as an integer.
fn first_column(message: &[u8]) -> Option<i64> {
    let rest = message.strip_prefix(b"I")?.get(4..)?.strip_prefix(b"N")?;
    let columns = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?);
    if columns == 0 {
        return None;
    }
    let column = rest.get(2..)?.strip_prefix(b"t")?;
    let length = usize::try_from(u32::from_be_bytes(column.get(..4)?.try_into().ok()?)).ok()?;
    std::str::from_utf8(column.get(4..4 + length)?)
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::{Inserted, first_column};

    /// An insert message as pgoutput writes it, with these text columns.
    fn insert(columns: &[&str]) -> Vec<u8> {
        let mut message = b"I".to_vec();
        message.extend(16_385_u32.to_be_bytes());
        message.push(b'N');
        message.extend(u16::try_from(columns.len()).unwrap().to_be_bytes());
        for column in columns {
            message.push(b't');
            message.extend(u32::try_from(column.len()).unwrap().to_be_bytes());
            message.extend(column.as_bytes());
        }
        message
    }

    #[test]
    fn the_seq_is_read_from_the_first_column() {
        let message = insert(&["42", "0193a6b0-0000-7000-8000-000000000000", "order"]);
        assert_eq!(first_column(&message), Some(42));
    }

    #[test]
    fn what_is_not_a_seq_reads_as_unknown() {
        assert_eq!(first_column(&insert(&["0193a6b0-0000-7000"])), None);
        assert_eq!(first_column(&insert(&[])), None);
        let mut null = insert(&[]);
        null.truncate(6);
        null.extend([0, 1, b'n']);
        assert_eq!(first_column(&null), None);
        let truncated = insert(&["123456"]);
        assert_eq!(first_column(&truncated[..truncated.len() - 1]), None);
    }

    #[test]
    fn a_transaction_with_an_unknown_insert_is_unknown_whole() {
        let mut inserted = Inserted::default();
        inserted.read(b"B....");
        assert_eq!(inserted.take(), None, "no insert");
        inserted.read(&insert(&["7"]));
        inserted.read(&insert(&["8"]));
        assert_eq!(inserted.take(), Some(vec![7, 8]));
        inserted.read(&insert(&["9"]));
        inserted.read(&insert(&["not a seq"]));
        assert_eq!(inserted.take(), Some(Vec::new()));
        assert_eq!(inserted.take(), None, "taken");
    }

    #[test]
    fn transactions_added_up_are_unknown_if_one_is() {
        let mut waiting = Inserted::default();
        waiting.add(&[1, 2]);
        waiting.add(&[3]);
        assert_eq!(waiting.take(), Some(vec![1, 2, 3]));
        waiting.add(&[1]);
        waiting.add(&[]);
        waiting.add(&[2]);
        assert_eq!(waiting.take(), Some(Vec::new()));
        waiting.add(&vec![5; Inserted::KEPT]);
        waiting.add(&[6]);
        assert_eq!(waiting.take(), Some(Vec::new()), "too many to keep");
    }
}
