//! BERT's uncased WordPiece tokenizer: the `BasicTokenizer` (text cleaning, lower-casing, accent
//! stripping, punctuation and CJK splitting) followed by greedy longest-match-first WordPiece,
//! as in Google's `tokenization.py` and Hugging Face's `BertTokenizer`.
//!
//! Plain Rust with no Wasm in sight, so its tests run natively with `cargo test`.

use std::collections::HashMap;

use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};

/// Words longer than this many characters become `[UNK]` (BERT's `max_input_chars_per_word`).
pub const MAX_CHARS_PER_WORD: usize = 100;

/// The ids of an encoded text, `[CLS]` first and `[SEP]` last.
pub type Ids = Vec<i64>;

/// A WordPiece vocabulary and the special tokens' ids.
pub struct Tokenizer {
    vocab: HashMap<String, i64>,
    unk: i64,
    cls: i64,
    sep: i64,
}

impl Tokenizer {
    /// Builds a tokenizer from a `vocab.txt`: one token per line, the id being the line number
    /// (from 0). It must contain `[UNK]`, `[CLS]` and `[SEP]`.
    pub fn from_vocab(text: &str) -> Result<Self, String> {
        let vocab: HashMap<String, i64> = text
            .lines()
            .enumerate()
            .map(|(i, line)| (line.trim_end_matches('\r').to_owned(), i as i64))
            .collect();
        let id = |token: &str| {
            vocab
                .get(token)
                .copied()
                .ok_or_else(|| format!("the vocabulary has no {token}"))
        };
        let (unk, cls, sep) = (id("[UNK]")?, id("[CLS]")?, id("[SEP]")?);
        Ok(Tokenizer {
            vocab,
            unk,
            cls,
            sep,
        })
    }

    /// The padding id: `[PAD]`, id 0 in BERT's vocabularies.
    pub const PAD: i64 = 0;

    /// Encodes `text` as `[CLS] pieces… [SEP]`, truncating the pieces so the whole fits in
    /// `max_len` ids (at least 2); `[SEP]` is always kept.
    pub fn encode(&self, text: &str, max_len: usize) -> Ids {
        let max_len = max_len.max(2);
        let mut ids = Vec::with_capacity(16);
        ids.push(self.cls);
        'words: for word in basic_tokenize(text) {
            for id in self.wordpiece(&word) {
                if ids.len() == max_len - 1 {
                    break 'words;
                }
                ids.push(id);
            }
        }
        ids.push(self.sep);
        ids
    }

    /// The WordPiece ids of one word: greedy longest match first, continuation pieces prefixed
    /// with `##`; a word that cannot be covered, or that is too long, is a single `[UNK]`.
    pub fn wordpiece(&self, word: &str) -> Vec<i64> {
        let chars: Vec<(usize, char)> = word.char_indices().collect();
        if chars.len() > MAX_CHARS_PER_WORD {
            return vec![self.unk];
        }
        let mut pieces = Vec::new();
        let mut candidate = String::with_capacity(word.len() + 2);
        let mut start = 0;
        while start < chars.len() {
            let mut end = chars.len();
            let mut found = None;
            while start < end {
                let from = chars[start].0;
                let to = chars.get(end).map_or(word.len(), |&(i, _)| i);
                candidate.clear();
                if start > 0 {
                    candidate.push_str("##");
                }
                candidate.push_str(&word[from..to]);
                if let Some(&id) = self.vocab.get(candidate.as_str()) {
                    found = Some(id);
                    break;
                }
                end -= 1;
            }
            match found {
                Some(id) => pieces.push(id),
                None => return vec![self.unk],
            }
            start = end;
        }
        pieces
    }
}

/// BERT's `BasicTokenizer` for uncased models: the words of `text`, cleaned, lower-cased, with
/// accents stripped, punctuation split off and CJK characters standing alone.
pub fn basic_tokenize(text: &str) -> Vec<String> {
    // Clean: drop NUL, U+FFFD and control characters; every whitespace becomes a space. CJK
    // characters get spaces around them so they become words of their own.
    let mut cleaned = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\0' || c == '\u{fffd}' || is_control(c) {
            continue;
        }
        if is_whitespace(c) {
            cleaned.push(' ');
        } else if is_cjk(c) {
            cleaned.push(' ');
            cleaned.push(c);
            cleaned.push(' ');
        } else {
            cleaned.push(c);
        }
    }

    let mut words = Vec::new();
    for token in cleaned.split(' ').filter(|t| !t.is_empty()) {
        // Lower-case, then strip accents: decompose (NFD) and drop the combining marks.
        let lowered = token.to_lowercase();
        let stripped: String = lowered
            .nfd()
            .filter(|&c| c.general_category() != GeneralCategory::NonspacingMark)
            .collect();
        // Split punctuation off: each punctuation character is a word of its own.
        let mut current = String::new();
        for c in stripped.chars() {
            if is_punctuation(c) {
                if !current.is_empty() {
                    words.push(std::mem::take(&mut current));
                }
                words.push(c.to_string());
            } else {
                current.push(c);
            }
        }
        if !current.is_empty() {
            words.push(current);
        }
    }
    // Stripping can leave whitespace-only pieces (never in practice, but BERT re-splits).
    words
        .into_iter()
        .flat_map(|w| w.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

/// BERT's `_is_whitespace`: space, tab, newline, carriage return, or category Zs.
fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r') || c.general_category() == GeneralCategory::SpaceSeparator
}

/// BERT's `_is_control`: categories Cc, Cf, Cn, Co, Cs, except tab, newline and carriage return
/// (which count as whitespace).
fn is_control(c: char) -> bool {
    if matches!(c, '\t' | '\n' | '\r') {
        return false;
    }
    c.general_category_group() == GeneralCategoryGroup::Other
}

/// BERT's `_is_punctuation`: every non-alphanumeric ASCII symbol (`$`, `^`, `` ` `` too), or a
/// Unicode punctuation category (P*).
fn is_punctuation(c: char) -> bool {
    let cp = c as u32;
    if (33..=47).contains(&cp)
        || (58..=64).contains(&cp)
        || (91..=96).contains(&cp)
        || (123..=126).contains(&cp)
    {
        return true;
    }
    c.general_category_group() == GeneralCategoryGroup::Punctuation
}

/// BERT's `_is_chinese_char`: the CJK Unified Ideographs blocks (not Hangul, Hiragana or
/// Katakana, which are written with spaces).
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_vocab(include_str!("../vocab.txt"))
            .expect("the vocabulary has the special tokens")
    }

    // Expected ids from Hugging Face `tokenizers` (BertWordPieceTokenizer, lowercase=True) with
    // the same vocab.txt.
    #[test]
    fn matches_reference_bert_uncased() {
        let t = tokenizer();
        let cases: &[(&str, &[i64])] = &[
            (
                "A man is eating food.",
                &[101, 1037, 2158, 2003, 5983, 2833, 1012, 102],
            ),
            (
                "A man is eating a piece of bread.",
                &[
                    101, 1037, 2158, 2003, 5983, 1037, 3538, 1997, 7852, 1012, 102,
                ],
            ),
            ("Hello, World!", &[101, 7592, 1010, 2088, 999, 102]),
            ("unaffable", &[101, 14477, 20961, 3468, 102]),
            (
                "Héllò wörld, Ça va? naïve café résumé",
                &[
                    101, 7592, 2088, 1010, 6187, 12436, 1029, 15743, 7668, 13746, 102,
                ],
            ),
            (
                "The quick brown fox jumps over the lazy dog's back... isn't it?",
                &[
                    101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1005, 1055, 2067,
                    1012, 1012, 1012, 3475, 1005, 1056, 2009, 1029, 102,
                ],
            ),
            (
                "我爱北京天安门",
                &[101, 1855, 100, 1781, 1755, 1811, 1820, 100, 102],
            ),
            (
                "東京タワーに行きます",
                &[
                    101, 1879, 1755, 1709, 30262, 30265, 30194, 1945, 1652, 30203, 30184, 102,
                ],
            ),
            (
                "슈퍼 엔저 장기화에",
                &[
                    101, 1461, 30016, 30004, 30008, 1463, 30009, 30021, 30000, 30008, 1464, 30006,
                    30025, 29991, 30019, 30005, 30012, 29999, 30009, 102,
                ],
            ),
            (
                "tokenization of unbelievably hyperparameterized transformers",
                &[
                    101, 19204, 3989, 1997, 4895, 8671, 2666, 3567, 6321, 23760, 28689, 22828,
                    3550, 19081, 102,
                ],
            ),
            (
                "$100.50 (USD) — 20% off! #sale @store",
                &[
                    101, 1002, 2531, 1012, 2753, 1006, 13751, 1007, 1517, 2322, 1003, 2125, 999,
                    1001, 5096, 1030, 3573, 102,
                ],
            ),
            ("emoji 😀 test", &[101, 7861, 29147, 2072, 100, 3231, 102]),
            (
                "e-mail: john.doe@example.com",
                &[
                    101, 1041, 1011, 5653, 1024, 2198, 1012, 18629, 1030, 2742, 1012, 4012, 102,
                ],
            ),
            (
                "COVID-19 vaccines",
                &[101, 2522, 17258, 1011, 2539, 28896, 102],
            ),
            ("ｆｕｌｌｗｉｄｔｈ ＡＢＣ", &[101, 100, 100, 102]),
        ];
        for (text, expected) in cases {
            assert_eq!(t.encode(text, 512), *expected, "text: {text:?}");
        }
    }

    #[test]
    fn basic_tokenizer_splits_like_bert() {
        assert_eq!(
            basic_tokenize(" \tHeLLo!how  \n Are yoU?  "),
            ["hello", "!", "how", "are", "you", "?"]
        );
        assert_eq!(basic_tokenize("Héllò wörld"), ["hello", "world"]);
        assert_eq!(basic_tokenize("ah博推zz"), ["ah", "博", "推", "zz"]);
        assert_eq!(basic_tokenize("a\u{0}b\u{fffd}c\u{200b}d"), ["abcd"]);
        assert_eq!(basic_tokenize("$5^2`x"), ["$", "5", "^", "2", "`", "x"]);
    }

    #[test]
    fn wordpiece_is_greedy_longest_match_first() {
        let t = tokenizer();
        // BERT's docstring example, with the real uncased vocabulary (not the docstring's toy one).
        let ids = t.wordpiece("unaffable");
        let names: Vec<&str> = ids
            .iter()
            .map(|id| {
                include_str!("../vocab.txt")
                    .lines()
                    .nth(*id as usize)
                    .unwrap_or("?")
            })
            .collect();
        assert_eq!(names, ["una", "##ffa", "##ble"]);
    }

    #[test]
    fn long_and_unknown_words_are_unk() {
        let t = tokenizer();
        let long = "a".repeat(MAX_CHARS_PER_WORD + 1);
        assert_eq!(t.encode(&long, 128), [101, 100, 102]);
        let exactly = "a".repeat(MAX_CHARS_PER_WORD);
        assert_ne!(t.encode(&exactly, 128), [101, 100, 102]);
        assert_eq!(t.wordpiece("\u{1F600}\u{1F600}"), [100]);
    }

    #[test]
    fn truncation_keeps_sep() {
        let t = tokenizer();
        let text = "word ".repeat(300);
        let ids = t.encode(&text, 128);
        assert_eq!(ids.len(), 128);
        assert_eq!(ids[0], 101);
        assert_eq!(ids[127], 102);
        assert!(
            ids[1..127].iter().all(|&id| id == 2773),
            "every middle id is 'word'"
        );
        assert_eq!(t.encode("", 128), [101, 102]);
        assert_eq!(t.encode("hello world", 2), [101, 102]);
    }
}
