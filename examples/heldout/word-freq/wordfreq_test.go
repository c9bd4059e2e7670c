package wordfreq

import (
	"reflect"
	"testing"
)

func TestWords(t *testing.T) {
	got := Words("Hello, world! Hello again, WORLD 2024.")
	want := []string{"hello", "world", "hello", "again", "world", "2024"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Words = %q, want %q", got, want)
	}
}

func TestTopOrdersByCount(t *testing.T) {
	got := Top("b a b c b a", 2)
	want := []Count{{"b", 3}, {"a", 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Top = %v, want %v", got, want)
	}
}

func TestTiesAreAlphabetical(t *testing.T) {
	got := Top("pear apple fig apple pear fig kiwi", 3)
	want := []Count{{"apple", 2}, {"fig", 2}, {"pear", 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Top = %v, want %v", got, want)
	}
}

func TestTopOfEmptyText(t *testing.T) {
	if got := Top("", 5); len(got) != 0 {
		t.Errorf("Top of empty text = %v, want nothing", got)
	}
}
