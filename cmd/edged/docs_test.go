package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The project's Markdown files link to each other by relative path and
// anchor: a moved file, a renamed heading or a typo fails here.
func TestDocsLinks(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			docs[p] = string(b)
		}
		return nil
	})
	if len(docs) < 5 {
		t.Fatalf("found %d Markdown files: the walk is wrong", len(docs))
	}
	anchors := map[string]map[string]bool{}
	for p, text := range docs {
		anchors[p] = docAnchors(text)
	}
	checked := 0
	for p, text := range docs {
		for _, m := range docLink.FindAllStringSubmatch(withoutCode(text), -1) {
			target := m[1]
			if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			file := p
			if path != "" {
				file = filepath.Join(filepath.Dir(p), path)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %q: no such file", rel(root, p), target)
					continue
				}
			}
			checked++
			if frag == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			if !anchors[file][frag] {
				t.Errorf("%s: link %q: %s has no heading #%s", rel(root, p), target, rel(root, file), frag)
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d links: the parse is wrong", checked)
	}
}

var (
	docLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	docHeading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	docFence   = regexp.MustCompile("(?ms)^```.*?^```")
)

// withoutCode drops fenced code blocks: their # lines are comments, their
// brackets no links.
func withoutCode(text string) string { return docFence.ReplaceAllString(text, "") }

// docAnchors are the anchors GitHub makes of a file's headings: lower
// case, punctuation dropped, spaces as hyphens, repeats numbered.
func docAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range docHeading.FindAllStringSubmatch(withoutCode(text), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(strings.ReplaceAll(m[1], "`", "")) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		s := strings.TrimSpace(b.String())
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func rel(root, p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}
