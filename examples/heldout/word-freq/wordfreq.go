// Package wordfreq finds the most frequent words of a text, for a tag cloud.
package wordfreq

import (
	"sort"
	"strings"
	"unicode"
)

// Count is a word and how often it occurs.
type Count struct {
	Word string
	N    int
}

// Words splits text into lower-case words: runs of letters and digits.
func Words(text string) []string {
	return strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
}

// Top returns the n most frequent words, most frequent first; words that occur equally
// often are in alphabetical order.
func Top(text string, n int) []Count {
	counts := map[string]int{}
	for _, w := range Words(text) {
		counts[w]++
	}
	list := make([]Count, 0, len(counts))
	for w, c := range counts {
		list = append(list, Count{w, c})
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].N != list[j].N {
			return list[i].N > list[j].N
		}
		return list[i].Word > list[j].Word
	})
	if len(list) > n {
		list = list[:n]
	}
	return list
}
