//! The unstable sorts of GNU libstdc++ (`std::sort`, `std::partial_sort`), step for step.
//!
//! llama.cpp orders candidates with these, and neither keeps equal elements in their
//! original order: which of two tokens with the same logit comes first decides which one
//! a draw lands on. Reproducing llama.cpp's choices therefore needs the same sequence of
//! compares and moves, not just any correct sort. `less(a, b)` is the C++ comparator
//! ("a goes before b").
//!
//! The index arithmetic follows the algorithms' published structure: introsort with a
//! median-of-three pivot, a depth limit of 2·⌊log₂ n⌋ that falls back to heapsort,
//! and a final insertion sort over runs of 16; partial sort as heap select plus heap sort.
//! Where the C++ relies on sentinels (and would read out of bounds under an inconsistent
//! comparator, e.g. NaN keys), the loops here stop at the slice ends instead.

const THRESHOLD: usize = 16;

/// `std::sort(v.begin(), v.end(), less)`.
pub(crate) fn sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    if v.is_empty() {
        return;
    }
    let depth = 2 * floor_log2(v.len());
    introsort_loop(v, depth, less);
    final_insertion_sort(v, less);
}

/// `std::partial_sort(v.begin(), v.begin() + middle, v.end(), less)`: the first `middle`
/// elements end up sorted and no later element goes before any of them.
pub(crate) fn partial_sort<T: Copy>(v: &mut [T], middle: usize, less: &impl Fn(&T, &T) -> bool) {
    heap_select(v, middle, less);
    sort_heap(v, middle, less);
}

fn floor_log2(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

fn introsort_loop<T: Copy>(v: &mut [T], mut depth: usize, less: &impl Fn(&T, &T) -> bool) {
    let mut v = v;
    while v.len() > THRESHOLD {
        if depth == 0 {
            let n = v.len();
            partial_sort(v, n, less);
            return;
        }
        depth -= 1;
        let cut = partition_around_pivot(v, less);
        let (left, right) = std::mem::take(&mut v).split_at_mut(cut);
        introsort_loop(right, depth, less);
        v = left;
    }
}

/// Moves the median of `v[1]`, `v[mid]`, `v[last]` to `v[0]` and partitions the rest
/// around it; returns where the upper part starts.
fn partition_around_pivot<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) -> usize {
    let n = v.len();
    let mid = n / 2;
    median_to_first(v, 0, 1, mid, n - 1, less);
    // Unguarded partition of [1, n) around v[0].
    let mut first = 1;
    let mut last = n;
    loop {
        while first < n && less(&v[first], &v[0]) {
            first += 1;
        }
        last -= 1;
        while last > 0 && less(&v[0], &v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

fn median_to_first<T: Copy>(
    v: &mut [T],
    result: usize,
    a: usize,
    b: usize,
    c: usize,
    less: &impl Fn(&T, &T) -> bool,
) {
    let pick = if less(&v[a], &v[b]) {
        if less(&v[b], &v[c]) {
            b
        } else if less(&v[a], &v[c]) {
            c
        } else {
            a
        }
    } else if less(&v[a], &v[c]) {
        a
    } else if less(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(result, pick);
}

fn final_insertion_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    if v.len() > THRESHOLD {
        insertion_sort(&mut v[..THRESHOLD], less);
        for i in THRESHOLD..v.len() {
            linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, less);
    }
}

fn insertion_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    for i in 1..v.len() {
        if less(&v[i], &v[0]) {
            let val = v[i];
            v.copy_within(0..i, 1);
            v[0] = val;
        } else {
            linear_insert(v, i, less);
        }
    }
}

/// Shifts `v[i]` down past every element it goes before.
fn linear_insert<T: Copy>(v: &mut [T], i: usize, less: &impl Fn(&T, &T) -> bool) {
    let val = v[i];
    let mut hole = i;
    while hole > 0 && less(&val, &v[hole - 1]) {
        v[hole] = v[hole - 1];
        hole -= 1;
    }
    v[hole] = val;
}

/// Builds a heap on `v[..middle]`, then swaps in every later element that goes before
/// the heap's top; afterwards `v[..middle]` holds the `middle` first elements (as a heap).
fn heap_select<T: Copy>(v: &mut [T], middle: usize, less: &impl Fn(&T, &T) -> bool) {
    make_heap(v, middle, less);
    for i in middle..v.len() {
        if less(&v[i], &v[0]) {
            pop_heap(v, middle, i, less);
        }
    }
}

fn sort_heap<T: Copy>(v: &mut [T], len: usize, less: &impl Fn(&T, &T) -> bool) {
    let mut last = len;
    while last > 1 {
        last -= 1;
        pop_heap(v, last, last, less);
    }
}

fn make_heap<T: Copy>(v: &mut [T], len: usize, less: &impl Fn(&T, &T) -> bool) {
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let value = v[parent];
        adjust_heap(v, parent, len, value, less);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

/// Moves the heap's top (of the heap `v[..len]`) to `v[result]` and re-heaps `v[..len]`
/// with the element that was at `result`.
fn pop_heap<T: Copy>(v: &mut [T], len: usize, result: usize, less: &impl Fn(&T, &T) -> bool) {
    let value = v[result];
    v[result] = v[0];
    adjust_heap(v, 0, len, value, less);
}

/// Sifts the hole at `hole` down to a leaf along the larger children, then pushes `value`
/// back up from there.
fn adjust_heap<T: Copy>(
    v: &mut [T],
    hole: usize,
    len: usize,
    value: T,
    less: &impl Fn(&T, &T) -> bool,
) {
    let top = hole;
    let mut hole = hole;
    let mut child = hole;
    // Signed like the C++ distance type: (len - 1) / 2 and (len - 2) / 2 truncate toward 0.
    let len_i = len as isize;
    while (child as isize) < (len_i - 1) / 2 {
        child = 2 * (child + 1);
        if less(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len & 1 == 0 && child as isize == (len_i - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    push_heap(v, hole, top, value, less);
}

fn push_heap<T: Copy>(
    v: &mut [T],
    hole: usize,
    top: usize,
    value: T,
    less: &impl Fn(&T, &T) -> bool,
) {
    let mut hole = hole;
    while hole > top {
        let parent = (hole - 1) / 2;
        if !less(&v[parent], &value) {
            break;
        }
        v[hole] = v[parent];
        hole = parent;
    }
    v[hole] = value;
}
