// Package roman writes numbers in Roman numerals, for chapter and volume headings.
package roman

import "strings"

var values = []int{1000, 900, 500, 400, 100, 90, 50, 40, 10, 9, 5, 4, 1}
var symbols = []string{"M", "CM", "D", "CD", "C", "XC", "L", "XL", "X", "IX", "V", "VI", "I"}

// ToRoman writes n, from 1 to 3999, in Roman numerals; anything else gives "".
func ToRoman(n int) string {
	if n < 1 || n > 3999 {
		return ""
	}
	var b strings.Builder
	for i, v := range values {
		for n >= v {
			b.WriteString(symbols[i])
			n -= v
		}
	}
	return b.String()
}
