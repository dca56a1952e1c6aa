//! Once the states a sequence meets are cached, computing its mask allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokensieve_grammar::{Grammar, Matcher, TokenIndex};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn warm_masks_allocate_nothing() {
    let tokens: Vec<Vec<u8>> = (0u32..5000)
        .map(|i| format!("{i}").into_bytes())
        .chain([b"\"".to_vec(), b"{".to_vec(), b"}".to_vec(), b",".to_vec()])
        .collect();
    let index = Arc::new(TokenIndex::new(tokens.iter().map(Vec::as_slice), &[]));
    let g = Grammar::new(r#"root ::= "{" [0-9]+ ("," [0-9]+)* "}""#).unwrap();
    let mut m = Matcher::with_vocab(&g, index.clone()).unwrap();
    let mut mask = vec![0u32; index.words()];
    let doc = index.greedy_tokenize(b"{12,345,6789}").unwrap();
    // Warm-up walk: every state of the document is cached.
    for &t in &doc {
        m.fill_mask(&mut mask).unwrap();
        m.accept_token(t).unwrap();
    }
    m.reset();
    for &t in &doc {
        let before = ALLOCS.load(Ordering::Relaxed);
        m.fill_mask(&mut mask).unwrap();
        assert_eq!(ALLOCS.load(Ordering::Relaxed), before, "fill_mask allocated");
        m.accept_token(t).unwrap();
    }
}
