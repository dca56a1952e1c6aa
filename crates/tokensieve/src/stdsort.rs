//! The sorting algorithms of GCC's libstdc++ (`std::sort`, `std::partial_sort`,
//! `std::nth_element`), restated so that the order they leave among *equal* keys can be
//! reproduced.
//!
//! llama.cpp and torch (CPU) both sort with these unstable algorithms, and their samplers decide
//! by array position (a random draw walks the array in order; `top_k` cuts at a position). Where
//! logits tie exactly, matching the reference engine's token choice therefore means matching
//! libstdc++'s tie order, not just sorting correctly. The structure follows the published
//! algorithm (introsort with median-of-three pivot, insertion-sort cut-off 16, heap select);
//! `../shared/reference/stdsort_model.py` is the executable description it was checked against.
//!
//! `less(a, b)` must be a strict weak order. Slices are sorted in place.

const THRESHOLD: usize = 16;

fn lg(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

// ---------------------------------------------------------------------------------- heaps

fn push_heap<T: Copy>(a: &mut [T], mut hole: usize, top: usize, value: T, less: &mut impl FnMut(&T, &T) -> bool) {
    while hole > top {
        let parent = (hole - 1) / 2;
        if !less(&a[parent], &value) {
            break;
        }
        a[hole] = a[parent];
        hole = parent;
    }
    a[hole] = value;
}

pub(crate) fn adjust_heap<T: Copy>(
    a: &mut [T],
    mut hole: usize,
    len: usize,
    value: T,
    less: &mut impl FnMut(&T, &T) -> bool,
) {
    let top = hole;
    let mut child = hole;
    while child < (len.saturating_sub(1)) / 2 {
        child = 2 * (child + 1);
        if less(&a[child], &a[child - 1]) {
            child -= 1;
        }
        a[hole] = a[child];
        hole = child;
    }
    if len & 1 == 0 && len >= 2 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        a[hole] = a[child - 1];
        hole = child - 1;
    }
    push_heap(a, hole, top, value, less);
}

pub(crate) fn make_heap<T: Copy>(a: &mut [T], less: &mut impl FnMut(&T, &T) -> bool) {
    let len = a.len();
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let v = a[parent];
        adjust_heap(a, parent, len, v, less);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

/// Moves the heap top of `a[..last]` to `result` and re-heaps `a[..last]` with the old
/// `a[result]` inserted.
fn pop_heap<T: Copy>(a: &mut [T], last: usize, result: usize, less: &mut impl FnMut(&T, &T) -> bool) {
    let value = a[result];
    a[result] = a[0];
    adjust_heap(a, 0, last, value, less);
}

fn heap_select<T: Copy>(a: &mut [T], middle: usize, less: &mut impl FnMut(&T, &T) -> bool) {
    make_heap(&mut a[..middle], less);
    for i in middle..a.len() {
        if less(&a[i], &a[0]) {
            pop_heap(a, middle, i, less);
        }
    }
}

pub(crate) fn sort_heap<T: Copy>(a: &mut [T], less: &mut impl FnMut(&T, &T) -> bool) {
    let mut last = a.len();
    while last > 1 {
        last -= 1;
        pop_heap(a, last, last, less);
    }
}

// ------------------------------------------------------------------------------ introsort

fn move_median_to_first<T: Copy>(
    a: &mut [T],
    result: usize,
    x: usize,
    y: usize,
    z: usize,
    less: &mut impl FnMut(&T, &T) -> bool,
) {
    let pick = if less(&a[x], &a[y]) {
        if less(&a[y], &a[z]) {
            y
        } else if less(&a[x], &a[z]) {
            z
        } else {
            x
        }
    } else if less(&a[x], &a[z]) {
        x
    } else if less(&a[y], &a[z]) {
        z
    } else {
        y
    };
    a.swap(result, pick);
}

/// Hoare partition around `a[pivot]` of `a[first..last]`; relies on sentinels (unguarded).
fn unguarded_partition<T: Copy>(
    a: &mut [T],
    mut first: usize,
    mut last: usize,
    pivot: usize,
    less: &mut impl FnMut(&T, &T) -> bool,
) -> usize {
    loop {
        while less(&a[first], &a[pivot]) {
            first += 1;
        }
        last -= 1;
        while less(&a[pivot], &a[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        a.swap(first, last);
        first += 1;
    }
}

fn partition_pivot<T: Copy>(a: &mut [T], first: usize, last: usize, less: &mut impl FnMut(&T, &T) -> bool) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(a, first, first + 1, mid, last - 1, less);
    unguarded_partition(a, first + 1, last, first, less)
}

fn unguarded_linear_insert<T: Copy>(a: &mut [T], mut last: usize, less: &mut impl FnMut(&T, &T) -> bool) {
    let val = a[last];
    let mut next = last - 1;
    while less(&val, &a[next]) {
        a[last] = a[next];
        last = next;
        next -= 1;
    }
    a[last] = val;
}

fn insertion_sort<T: Copy>(a: &mut [T], first: usize, last: usize, less: &mut impl FnMut(&T, &T) -> bool) {
    if first == last {
        return;
    }
    for i in first + 1..last {
        if less(&a[i], &a[first]) {
            let val = a[i];
            a.copy_within(first..i, first + 1);
            a[first] = val;
        } else {
            unguarded_linear_insert(a, i, less);
        }
    }
}

fn final_insertion_sort<T: Copy>(a: &mut [T], first: usize, last: usize, less: &mut impl FnMut(&T, &T) -> bool) {
    if last - first > THRESHOLD {
        insertion_sort(a, first, first + THRESHOLD, less);
        for i in first + THRESHOLD..last {
            unguarded_linear_insert(a, i, less);
        }
    } else {
        insertion_sort(a, first, last, less);
    }
}

fn introsort_loop<T: Copy>(
    a: &mut [T],
    first: usize,
    mut last: usize,
    mut depth: usize,
    less: &mut impl FnMut(&T, &T) -> bool,
) {
    while last - first > THRESHOLD {
        if depth == 0 {
            let s = &mut a[first..last];
            let n = s.len();
            heap_select(s, n, less);
            sort_heap(s, less);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(a, first, last, less);
        introsort_loop(a, cut, last, depth, less);
        last = cut;
    }
}

/// `std::sort(a.begin(), a.end(), less)` as libstdc++ implements it.
pub fn sort<T: Copy>(a: &mut [T], mut less: impl FnMut(&T, &T) -> bool) {
    let n = a.len();
    if n > 0 {
        introsort_loop(a, 0, n, 2 * lg(n), &mut less);
        final_insertion_sort(a, 0, n, &mut less);
    }
}

/// `std::partial_sort(a.begin(), a.begin() + middle, a.end(), less)`: the `middle` smallest
/// (by `less`) elements sorted at the front, the rest in heap-select order.
pub fn partial_sort<T: Copy>(a: &mut [T], middle: usize, mut less: impl FnMut(&T, &T) -> bool) {
    let middle = middle.min(a.len());
    heap_select(a, middle, &mut less);
    sort_heap(&mut a[..middle], &mut less);
}

/// `std::nth_element(a.begin(), a.begin() + nth, a.end(), less)`.
pub fn nth_element<T: Copy>(a: &mut [T], nth: usize, mut less: impl FnMut(&T, &T) -> bool) {
    let (mut first, mut last) = (0usize, a.len());
    if first == last || nth >= last {
        return;
    }
    let mut depth = 2 * lg(last - first);
    while last - first > 3 {
        if depth == 0 {
            heap_select(&mut a[first..last], nth + 1 - first, &mut less);
            a.swap(first, nth);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(a, first, last, &mut less);
        if cut <= nth {
            first = cut;
        } else {
            last = cut;
        }
    }
    insertion_sort(a, first, last, &mut less);
}

#[cfg(test)]
mod tests {
    use super::*;

    // A tiny deterministic generator so these tests need no dependency.
    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn sorts_like_a_correct_sort_on_keys() {
        let mut s = 7;
        for n in [0usize, 1, 2, 3, 15, 16, 17, 100, 1000, 5000] {
            for modulus in [3u64, 50, 1 << 30] {
                let v: Vec<(u64, usize)> = (0..n).map(|i| (lcg(&mut s) % modulus, i)).collect();
                let mut a = v.clone();
                sort(&mut a, |x, y| x.0 < y.0);
                let mut b = v.clone();
                b.sort_by_key(|x| x.0);
                assert_eq!(a.iter().map(|x| x.0).collect::<Vec<_>>(), b.iter().map(|x| x.0).collect::<Vec<_>>());
                let mut ids: Vec<usize> = a.iter().map(|x| x.1).collect();
                ids.sort();
                assert_eq!(ids, (0..n).collect::<Vec<_>>(), "a permutation");
            }
        }
    }

    #[test]
    fn partial_sort_and_nth_element_put_the_right_keys_in_place() {
        let mut s = 11;
        for n in [1usize, 2, 5, 40, 129, 1000] {
            let v: Vec<(u64, usize)> = (0..n).map(|i| (lcg(&mut s) % 20, i)).collect();
            let mut sorted = v.clone();
            sorted.sort_by_key(|x| x.0);
            for k in [0, 1, n / 2, n] {
                let mut a = v.clone();
                partial_sort(&mut a, k, |x, y| x.0 < y.0);
                assert_eq!(
                    a[..k].iter().map(|x| x.0).collect::<Vec<_>>(),
                    sorted[..k].iter().map(|x| x.0).collect::<Vec<_>>()
                );
                if k < n {
                    let mut a = v.clone();
                    nth_element(&mut a, k, |x, y| x.0 < y.0);
                    assert_eq!(a[k].0, sorted[k].0);
                    assert!(a[..k].iter().all(|x| x.0 <= a[k].0) && a[k + 1..].iter().all(|x| x.0 >= a[k].0));
                }
            }
        }
    }

    /// Tie orders computed with `../shared/reference/stdsort_model.py` (libstdc++'s algorithms):
    /// `torch_cpu_sort_indices([1,0,1,0,1,1,0,1], descending=True)` and the heap order that
    /// `std::partial_sort` leaves on 20 equal keys.
    #[test]
    fn reproduces_libstdcxx_tie_order() {
        let vals = [1, 0, 1, 0, 1, 1, 0, 1];
        let mut a: Vec<(i32, usize)> = vals.iter().copied().zip(0..).collect();
        sort(&mut a, |x, y| x.0 > y.0);
        assert_eq!(a.iter().map(|x| x.1).collect::<Vec<_>>(), vec![0, 2, 4, 5, 7, 1, 3, 6]);
        let mut e: Vec<(i32, usize)> = (0..20).map(|i| (0, i)).collect();
        partial_sort(&mut e, 20, |x, y| x.0 > y.0);
        let ids: Vec<usize> = e.iter().map(|x| x.1).collect();
        assert_eq!(ids, vec![18, 10, 4, 16, 12, 8, 19, 1, 11, 5, 15, 13, 7, 17, 3, 9, 0, 2, 6, 14]);
    }

    #[test]
    fn matches_the_reference_model_on_random_tie_heavy_inputs() {
        let v: serde_json::Value = serde_json::from_str(include_str!("../testdata/stdsort_vectors.json")).unwrap();
        let ids = |x: &serde_json::Value| -> Vec<usize> {
            x.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as usize).collect()
        };
        for case in v["cases"].as_array().unwrap() {
            let vals = ids(&case["values"]);
            let fresh = || -> Vec<(usize, usize)> { vals.iter().copied().zip(0..).collect() };
            let desc = |x: &(usize, usize), y: &(usize, usize)| x.0 > y.0;
            let order = |a: Vec<(usize, usize)>| a.into_iter().map(|x| x.1).collect::<Vec<_>>();
            let mut a = fresh();
            sort(&mut a, desc);
            assert_eq!(order(a), ids(&case["sort_desc"]));
            let mut a = fresh();
            partial_sort(&mut a, case["partial_sort_k"].as_u64().unwrap() as usize, desc);
            assert_eq!(order(a), ids(&case["partial_sort_desc"]));
            let mut a = fresh();
            partial_sort(&mut a, vals.len(), desc);
            assert_eq!(order(a), ids(&case["partial_sort_full_desc"]));
            let mut a = fresh();
            nth_element(&mut a, case["nth"].as_u64().unwrap() as usize, desc);
            assert_eq!(order(a), ids(&case["nth_element_desc"]));
        }
    }
}
