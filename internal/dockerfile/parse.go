// Package dockerfile reads what kosa8 needs of a Dockerfile on the host,
// before the build itself runs with buildah inside a builder sandbox:
// which images its stages start from (pulled on the host into kosa8's
// cache and handed to the builder), and a copy of the file in which those
// images are named by the local names the builder knows them under.
// It also reads .dockerignore and walks the build context
// (context.go).
//
// Everything here reads a file that came with a repository, so every
// function is bounded (MaxSize, MaxInstructions, MaxStages, MaxImages)
// and fuzzed. Only the parts of the syntax that name images are
// interpreted: instructions are found as BuildKit finds them (parser
// directives, the escape character, line continuations, comments and
// heredocs), and FROM, COPY --from and RUN --mount=...,from= are read;
// the rest of each instruction is left to buildah.
package dockerfile

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Bounds on a Dockerfile.
const (
	MaxSize         = 1 << 20 // bytes
	MaxInstructions = 10_000
	MaxStages       = 64
	MaxImages       = 32 // distinct images named by FROM, COPY --from and RUN --mount from=
	maxRefLen       = 512
)

// ErrSyntax marks a Dockerfile kosa8 cannot read.
var ErrSyntax = errors.New("dockerfile")

// File is a parsed Dockerfile.
type File struct {
	src          []byte
	Escape       byte
	Instructions []*Instruction
}

// Instruction is one logical instruction: its keyword and its words, each
// word with where it came from in the file.
type Instruction struct {
	Keyword string // upper case: FROM, RUN, COPY, ...
	Line    int    // 1-based line of its first line
	Words   []Word // the words after the keyword, split on blanks
}

// Word is a blank-separated word of an instruction and its place in the
// file. A word that runs across a line continuation has no single place
// (Start < 0): it is read but cannot be rewritten.
type Word struct {
	Text       string
	Start, End int // byte offsets in the file
	pos        []int
}

// sub returns the offsets in the file of Text[i:j], or false when they are
// not one run of bytes there.
func (w Word) sub(i, j int) (int, int, bool) {
	if i < 0 || j > len(w.pos) || i >= j {
		return 0, 0, false
	}
	if w.pos[j-1]-w.pos[i] != j-1-i {
		return 0, 0, false
	}
	return w.pos[i], w.pos[j-1] + 1, true
}

func syntaxErr(line int, format string, a ...any) error {
	return fmt.Errorf("%w line %d: %s", ErrSyntax, line, fmt.Sprintf(format, a...))
}

var directiveRE = regexp.MustCompile(`^#[ \t]*([a-zA-Z][a-zA-Z0-9]*)[ \t]*=[ \t]*(.*?)[ \t]*$`)

// heredocKeywords are the instructions BuildKit and buildah read heredocs
// in.
var heredocKeywords = map[string]bool{"RUN": true, "COPY": true, "ADD": true}

// Parse splits src into instructions.
func Parse(src []byte) (*File, error) {
	if len(src) > MaxSize {
		return nil, fmt.Errorf("%w: larger than %d KiB", ErrSyntax, MaxSize>>10)
	}
	if bytes.IndexByte(src, 0) >= 0 {
		return nil, fmt.Errorf("%w: holds a NUL byte: not a text file", ErrSyntax)
	}
	f := &File{src: src, Escape: '\\'}
	// Lines with their offsets; a trailing \r is not part of a line.
	type line struct {
		off  int
		text string
	}
	var lines []line
	for off := 0; off < len(src); {
		end := bytes.IndexByte(src[off:], '\n')
		next := off + end + 1
		if end < 0 {
			end, next = len(src)-off, len(src)
		}
		lines = append(lines, line{off, strings.TrimSuffix(string(src[off:off+end]), "\r")})
		off = next
	}
	i := 0
	// Parser directives: only at the very top, before any other line.
	for ; i < len(lines); i++ {
		m := directiveRE.FindStringSubmatch(lines[i].text)
		if m == nil {
			break
		}
		if strings.EqualFold(m[1], "escape") {
			if m[2] != `\` && m[2] != "`" {
				return nil, syntaxErr(i+1, "escape directive %q: only \\ or ` are allowed", m[2])
			}
			f.Escape = m[2][0]
		}
	}
	blank := func(s string) bool { return strings.TrimLeft(s, " \t") == "" }
	comment := func(s string) bool { return strings.HasPrefix(strings.TrimLeft(s, " \t"), "#") }
	for i < len(lines) {
		if blank(lines[i].text) || comment(lines[i].text) {
			i++
			continue
		}
		if len(f.Instructions) >= MaxInstructions {
			return nil, syntaxErr(i+1, "more than %d instructions", MaxInstructions)
		}
		first := i
		var text []byte
		var pos []int
		for {
			l := lines[i]
			s := strings.TrimRight(l.text, " \t")
			cont := len(s) > 0 && s[len(s)-1] == f.Escape
			if cont {
				s = s[:len(s)-1]
			}
			for k := 0; k < len(s); k++ {
				text = append(text, s[k])
				pos = append(pos, l.off+k)
			}
			i++
			if !cont {
				break
			}
			// Comments and blank lines inside a continuation are skipped.
			for i < len(lines) && (blank(lines[i].text) || comment(lines[i].text)) {
				i++
			}
			if i >= len(lines) {
				break
			}
		}
		words := splitWords(text, pos)
		if len(words) == 0 {
			continue // a line holding only the escape character
		}
		in := &Instruction{Keyword: strings.ToUpper(words[0].Text), Line: first + 1, Words: words[1:]}
		f.Instructions = append(f.Instructions, in)
		if !heredocKeywords[in.Keyword] {
			continue
		}
		// Heredocs: each <<NAME (in order) takes the lines after the
		// instruction up to a line that is NAME alone.
		for _, w := range in.Words {
			name, strip, ok := heredoc(w.Text)
			if !ok {
				continue
			}
			for {
				if i >= len(lines) {
					return nil, syntaxErr(in.Line, "heredoc <<%s is not closed", name)
				}
				t := lines[i].text
				i++
				if strip {
					t = strings.TrimLeft(t, "\t")
				}
				if t == name {
					break
				}
			}
		}
	}
	return f, nil
}

var heredocRE = regexp.MustCompile(`^<<(-?)(["']?)([A-Za-z0-9_.-]+)(["']?)$`)

// heredoc reads a word that opens a heredoc: <<NAME, <<-NAME, <<"NAME".
func heredoc(w string) (name string, stripTabs, ok bool) {
	m := heredocRE.FindStringSubmatch(w)
	if m == nil || m[2] != m[4] {
		return "", false, false
	}
	return m[3], m[1] == "-", true
}

// splitWords splits an instruction's text on blanks, keeping each word's
// offsets in the file. Quotes are not interpreted: the words kosa8 reads
// (image references, flags) hold none.
func splitWords(text []byte, pos []int) []Word {
	var out []Word
	for k := 0; k < len(text); {
		if text[k] == ' ' || text[k] == '\t' {
			k++
			continue
		}
		j := k
		for j < len(text) && text[j] != ' ' && text[j] != '\t' {
			j++
		}
		w := Word{Text: string(text[k:j]), pos: pos[k:j:j], Start: -1, End: -1}
		if s, e, ok := w.sub(0, j-k); ok {
			w.Start, w.End = s, e
		}
		out = append(out, w)
		k = j
	}
	return out
}

// flags splits an instruction's leading --name=value words from the rest.
func (in *Instruction) flags() (flags []Word, rest []Word) {
	k := 0
	for k < len(in.Words) && strings.HasPrefix(in.Words[k].Text, "--") {
		k++
	}
	return in.Words[:k], in.Words[k:]
}

// flagValue splits a --name=value word.
func flagValue(w Word) (name, value string, valueAt int) {
	n, v, ok := strings.Cut(strings.TrimPrefix(w.Text, "--"), "=")
	if !ok {
		return strings.ToLower(n), "", len(w.Text)
	}
	return strings.ToLower(n), v, len(w.Text) - len(v)
}
