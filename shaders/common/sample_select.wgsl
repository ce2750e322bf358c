// The GPU-shaped kernels' selection (sample_heap.wgsl is the CPU-shaped one): a
// workgroup's selection of the k largest keys among its items by radix select (four
// rounds of 8-bit digits over a histogram in workgroup memory), ties at the threshold
// taken in item order. The including kernel defines
//   fn item_key(i: u32) -> u32          (0: no item at i)
//   fn item_out(pos: u32, key: u32, i: u32)
// and calls select_top with each invocation's run of items [lo, hi), runs in
// invocation order, so that "item order" is the items' index order.

var<workgroup> sel_hist: array<atomic<u32>, 256>;
var<workgroup> sel_digit: u32;
var<workgroup> sel_need: u32;
var<workgroup> sel_gt: array<u32, 256>;
var<workgroup> sel_eq: array<u32, 256>;
var<workgroup> sel_total: u32;
var<workgroup> sel_floor: u32;

// Emits (through item_out, at positions 0..count in item order) the min(k, items) items
// with the largest keys; among items whose key equals the k-th largest, the first ones.
// Returns the count (uniform).
fn select_top(lid: u32, lo: u32, hi: u32, k: u32) -> u32 {
    // A floor under the k-th largest key: the k-th largest of the invocations' largest
    // keys (k invocations hold a key at least that large). Keys below it are never
    // counted, which spares the histogram's atomics nearly every item.
    var mx = 0u;
    for (var i = lo; i < hi; i++) {
        mx = max(mx, item_key(i));
    }
    sel_gt[lid] = mx;
    if (lid == 0u) {
        sel_floor = 1u;
    }
    workgroupBarrier();
    if (mx != 0u) {
        var rank = 0u;
        for (var j = 0u; j < 256u; j++) {
            let m = sel_gt[j];
            if (m > mx || (m == mx && j < lid)) {
                rank++;
            }
        }
        if (rank + 1u == k) {
            sel_floor = mx;
        }
    }
    let floor = workgroupUniformLoad(&sel_floor);
    var prefix = 0u;
    var mask = 0u;
    var need = k;
    var all = false;
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        atomicStore(&sel_hist[lid], 0u);
        workgroupBarrier();
        if (!all) {
            for (var i = lo; i < hi; i++) {
                let key = item_key(i);
                if (key >= floor && (key & mask) == prefix) {
                    atomicAdd(&sel_hist[(key >> shift) & 255u], 1u);
                }
            }
        }
        workgroupBarrier();
        if (lid == 0u) {
            var cum = 0u;
            var d = 256u;
            for (var j = 0u; j < 256u; j++) {
                let c = atomicLoad(&sel_hist[255u - j]);
                if (cum + c >= need) {
                    d = 255u - j;
                    break;
                }
                cum += c;
            }
            sel_digit = d;
            sel_need = need - min(cum, need);
        }
        let d = workgroupUniformLoad(&sel_digit);
        let nn = workgroupUniformLoad(&sel_need);
        if (!all) {
            if (d == 256u) {
                // Fewer than k items at all: take every one.
                all = true;
            } else {
                prefix |= d << shift;
                mask |= 255u << shift;
                need = nn;
            }
        }
    }
    // prefix is now the k-th largest key; `need` items equal to it are taken.
    var g = 0u;
    var e = 0u;
    for (var i = lo; i < hi; i++) {
        let key = item_key(i);
        if (key == 0u) {
            continue;
        }
        if (all || key > prefix) {
            g++;
        } else if (key == prefix) {
            e++;
        }
    }
    sel_gt[lid] = g;
    sel_eq[lid] = e;
    workgroupBarrier();
    if (lid == 0u) {
        var q = 0u;
        var ties = 0u;
        for (var j = 0u; j < 256u; j++) {
            let gj = sel_gt[j];
            let ej = sel_eq[j];
            let take = min(ej, need - min(ties, need));
            sel_gt[j] = q;
            sel_eq[j] = ties;
            q += gj + take;
            ties += ej;
        }
        sel_total = q;
    }
    workgroupBarrier();
    var pos = sel_gt[lid];
    var ties = sel_eq[lid];
    for (var i = lo; i < hi; i++) {
        let key = item_key(i);
        if (key == 0u) {
            continue;
        }
        if (all || key > prefix) {
            item_out(pos, key, i);
            pos++;
        } else if (key == prefix) {
            if (ties < need) {
                item_out(pos, key, i);
                pos++;
            }
            ties++;
        }
    }
    return workgroupUniformLoad(&sel_total);
}
