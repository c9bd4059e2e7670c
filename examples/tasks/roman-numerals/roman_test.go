package roman

import "testing"

func TestToRoman(t *testing.T) {
	cases := []struct {
		n    int
		want string
	}{
		{1, "I"},
		{3, "III"},
		{4, "IV"},
		{9, "IX"},
		{14, "XIV"},
		{40, "XL"},
		{1994, "MCMXCIV"},
		{2024, "MMXXIV"},
	}
	for _, c := range cases {
		if got := ToRoman(c.n); got != c.want {
			t.Errorf("ToRoman(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

func TestOutOfRange(t *testing.T) {
	for _, n := range []int{0, -1, 4000} {
		if got := ToRoman(n); got != "" {
			t.Errorf("ToRoman(%d) = %q, want \"\"", n, got)
		}
	}
}
