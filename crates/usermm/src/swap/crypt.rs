//! Encryption at rest for swap slots: ChaCha20-Poly1305 (RFC 8439) with one random key per
//! device, drawn from the kernel's generator when the device opens and held only in this
//! process's memory, so what reaches the disk (the file tier) or the store (the Redis tier) is
//! unreadable once the process is gone (even after SIGKILL, when a named swap file is left
//! behind). Mirrors no kernel file: Linux leaves
//! this to dm-crypt under the swap device; here the device encrypts each page itself.
//!
//! Every page write takes a fresh 96-bit nonce from a per-device counter (never reused under
//! one key), and the slot number is authenticated as associated data, so a page read back is
//! exactly the page last written to that slot: a page altered on disk, or moved to another
//! slot, fails authentication and the read returns an error (the page is then poisoned like on
//! any read error). Nonce and 16-byte tag of each slot stay in memory (24 bytes a slot, 0.6% of
//! the device), never on disk.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::conv::Narrow;
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};

/// The per-slot state: the nonce counter of its last write (0: never written or discarded) and
/// the tag, as two words.
#[derive(Default)]
struct SlotMeta {
    nonce: AtomicU64,
    tag: [AtomicU64; 2],
}

/// Encrypts and decrypts the pages of one device (see the module documentation).
pub struct SlotCipher {
    aead: ChaCha20Poly1305,
    next_nonce: AtomicU64,
    slots: Box<[SlotMeta]>,
}

impl std::fmt::Debug for SlotCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("SlotCipher")
            .field("slots", &self.slots.len())
            .finish()
    }
}

fn nonce_bytes(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&n.to_le_bytes());
    Nonce::from(b)
}

impl SlotCipher {
    /// A cipher for `nr_slots` slots with a fresh random key.
    pub fn new(nr_slots: u64) -> io::Result<SlotCipher> {
        let mut key = [0u8; 32];
        crate::sys::random_bytes(&mut key).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot draw a swap encryption key from getrandom(2): {e}"),
            )
        })?;
        let aead = ChaCha20Poly1305::new(Key::from_slice(&key));
        key.fill(0);
        Ok(SlotCipher {
            aead,
            next_nonce: AtomicU64::new(1),
            slots: (0..nr_slots).map(|_| SlotMeta::default()).collect(),
        })
    }

    /// Encrypts `page` in place as the new content of `slot`.
    pub fn seal(&self, slot: u64, page: &mut [u8]) -> io::Result<()> {
        let n = self.next_nonce.fetch_add(1, Ordering::Relaxed);
        let tag = self
            .aead
            .encrypt_in_place_detached(&nonce_bytes(n), &slot.to_le_bytes(), page)
            .map_err(|_| io::Error::other(format!("encrypting swap slot {slot} failed")))?;
        let m = &self.slots[slot.usize()];
        m.tag[0].store(
            u64::from_le_bytes(tag[..8].try_into().expect("8 bytes")),
            Ordering::Relaxed,
        );
        m.tag[1].store(
            u64::from_le_bytes(tag[8..].try_into().expect("8 bytes")),
            Ordering::Relaxed,
        );
        m.nonce.store(n, Ordering::Release);
        Ok(())
    }

    /// Decrypts `page` (read from `slot`) in place. A slot never written (or discarded) reads
    /// as zeros, like an unwritten device; a page that fails authentication is an
    /// `InvalidData` error.
    pub fn open(&self, slot: u64, page: &mut [u8]) -> io::Result<()> {
        let m = &self.slots[slot.usize()];
        let n = m.nonce.load(Ordering::Acquire);
        if n == 0 {
            page.fill(0);
            return Ok(());
        }
        let mut tag = [0u8; 16];
        tag[..8].copy_from_slice(&m.tag[0].load(Ordering::Relaxed).to_le_bytes());
        tag[8..].copy_from_slice(&m.tag[1].load(Ordering::Relaxed).to_le_bytes());
        self.aead
            .decrypt_in_place_detached(
                &nonce_bytes(n),
                &slot.to_le_bytes(),
                page,
                Tag::from_slice(&tag),
            )
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "swap slot {slot} failed authentication: its page was changed where it \
                         was stored (on disk, in the cluster) after usermm wrote it"
                    ),
                )
            })
    }

    /// Slots `[slot, slot+n)` hold nothing any more.
    pub fn forget(&self, slot: u64, n: u64) {
        for m in &self.slots[slot.usize()..(slot + n).usize()] {
            m.nonce.store(0, Ordering::Release);
        }
    }
}
