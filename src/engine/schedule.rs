//! How a step's batch is shared between waiting prompts: equally, so that a short prompt
//! arriving behind a long one is decoded within a step or two instead of after it.

/// Splits `room` batch slots between prompts needing `needs` tokens: equal shares,
/// where a prompt needing less than its share leaves the rest to the others; the
/// remainder goes to the first ones.
pub(super) fn fair_shares(needs: &[usize], mut room: usize) -> Vec<usize> {
    let mut share = vec![0; needs.len()];
    let mut open: Vec<usize> = (0..needs.len()).filter(|&i| needs[i] > 0).collect();
    while room > 0 && !open.is_empty() {
        let each = (room / open.len()).max(1);
        for &i in &open {
            let add = each.min(needs[i] - share[i]).min(room);
            share[i] += add;
            room -= add;
        }
        open.retain(|&i| share[i] < needs[i]);
    }
    share
}

#[cfg(test)]
mod tests {
    use super::fair_shares;

    #[test]
    fn shares_fill_the_room_fairly() {
        assert_eq!(fair_shares(&[3000], 2048), vec![2048]);
        assert_eq!(fair_shares(&[2000, 10], 2048), vec![2000, 10]);
        assert_eq!(fair_shares(&[2000, 3000], 2048), vec![1024, 1024]);
        assert_eq!(fair_shares(&[2000, 10, 3000], 2048), vec![1019, 10, 1019]);
        assert_eq!(fair_shares(&[5, 5, 5], 2), vec![1, 1, 0]);
        assert_eq!(fair_shares(&[0, 7], 4), vec![0, 4]);
        assert_eq!(fair_shares(&[], 4), Vec::<usize>::new());
        // Never more than the room nor than a prompt needs.
        for (needs, room) in [(vec![1, 2, 3, 4], 7), (vec![100, 1, 1], 50)] {
            let s = fair_shares(&needs, room);
            assert!(s.iter().sum::<usize>() <= room);
            assert!(s.iter().zip(&needs).all(|(a, b)| a <= b));
        }
    }
}
